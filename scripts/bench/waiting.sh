#!/usr/bin/env bash
# waiting.sh: WAIT_N streams waiting in the queue on one api process.
#
# One api with DIRECT_PATH_ENABLED=false, CONNECTION_POOL_SIZE=1 and no
# consumer, so every stream waits: QUEUE_FAILOVER_TIMEOUT_SECONDS=60 (each
# then ends with an `error` event of type queue-timeout, counted as an
# error, not lost), HEARTBEAT_INTERVAL_SECONDS=2, and an overflow threshold
# and a per-identity queue limit (QUEUE_MAX_PER_IDENTITY; every stream
# comes from one address) above WAIT_N so none is refused. The load tool opens WAIT_N streams
# (ramped over WAIT_RAMP) and records every ping's interval. The api's
# VmRSS is sampled before the load and, once spillway_active_streams
# {path="queued"} reaches WAIT_N, every second for PLATEAU_SAMPLES
# seconds: (plateau − idle) / WAIT_N is the memory per waiting stream;
# the same from the samples PLATEAU_SETTLE (20) seconds into the plateau
# on is kib_per_stream_settled.
# After the load it samples RSS for AFTER_SECONDS (60) more seconds, and
# /metrics every AFTER_SCRAPE_EVERY (10): is the memory given back to the
# system?
#
# WAIT_IMAGE_BYTES (default 0), when set, sends every stream's prompt
# with an inline image of that many base64 bytes (loadtest -image-bytes),
# as a chat client sends a photo: what the api keeps per waiting stream
# once the job is enqueued must not include the body (BODY_BYTES_IN_FLIGHT,
# docs/OPERATIONS.md). QUEUE_MAX_BYTES is raised to hold every job;
# Redis then holds WAIT_N × WAIT_IMAGE_BYTES (10 GB for 10,000 × 1 MiB),
# so the run stops first unless MemAvailable is 1.5× that. Set WAIT_RAMP
# and QUEUE_TIMEOUT longer for it (the api reads and enqueues 1 MiB per
# stream): 40s and 150 on this 2-core machine.
#
# WAIT_API_ENV adds VAR=value settings (space-separated) to the api's, e.g.
# longer Redis timeouts when the machine is loaded by others.
#
# The settled figure (kib_per_stream_settled, from PLATEAU_SETTLE s into
# the plateau) comes after the api's memory returner gave the settled
# burst's free pages back (a second or two after the count stopped
# rising, internal/app/memreturn.go); samples.tsv's
# heap_released_bytes shows when it did.
#
# Needs WAIT_N + a margin of open files in both the api and the load tool:
# it raises the soft limit to 65536 or to the hard limit, whichever is
# lower, and stops if that is not enough.
#
# It saves the api's /metrics (the runtime's memory classes among them)
# when idle, at the plateau and AFTER_SECONDS after the load; with
# BENCH_PROFILE=1 also its heap profile at the same three points (at the
# plateau with the goroutine profile, after the load with the goroutines
# as text): what a waiting stream holds, and what stays live after.
#
# Writes $RESULTS/waiting/{waiting.json,samples.tsv} and $RESULTS/waiting.json.
source "$(dirname "$0")/lib.sh"
SCENARIO=waiting

# anon_kib PID prints the anonymous part of PID's RSS in KiB: the RSS
# less the pages of files it maps, its own binary's text above all, which
# vary by 10 MB between runs of the same code with the page cache's state
# (a binary run often gets its text in 2 MB pages).
anon_kib() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status"; }
require_tools jq curl redis-server redis-cli ss

WAIT_N=${WAIT_N:-10000}
WAIT_RAMP=${WAIT_RAMP:-10s}
QUEUE_TIMEOUT=${QUEUE_TIMEOUT:-60}
HEARTBEAT=${HEARTBEAT:-2}
PLATEAU_SAMPLES=${PLATEAU_SAMPLES:-10}
PLATEAU_SETTLE=${PLATEAU_SETTLE:-20}
AFTER_SECONDS=${AFTER_SECONDS:-60}
WAIT_IMAGE_BYTES=${WAIT_IMAGE_BYTES:-0}
QUEUE_MAX_BYTES=268435456
IMAGE_ARGS=()
if ((WAIT_IMAGE_BYTES > 0)); then
	need_kib=$((WAIT_N * (WAIT_IMAGE_BYTES + 4096) / 1024 * 3 / 2))
	avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
	((avail_kib >= need_kib)) || die "waiting: Redis would hold $((WAIT_N * WAIT_IMAGE_BYTES >> 20)) MiB of jobs; MemAvailable ${avail_kib} KiB is below 1.5x that"
	QUEUE_MAX_BYTES=$((WAIT_N * (WAIT_IMAGE_BYTES + 65536) * 2))
	IMAGE_ARGS=(-image-bytes "$WAIT_IMAGE_BYTES")
fi

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
NOFILE=$(ulimit -n)
((NOFILE >= WAIT_N + 1000)) || die "open files limit $NOFILE is below $((WAIT_N + 1000)); raise the hard limit (ulimit -Hn)"
log "open files limit $NOFILE (hard $(ulimit -Hn))"

dir="$RESULTS/waiting"
mkdir -p "$dir"
start_redis
start_api api DIRECT_PATH_ENABLED=false CONNECTION_POOL_SIZE=1 LLM_PROVIDER=sim \
	QUEUE_FAILOVER_TIMEOUT_SECONDS="$QUEUE_TIMEOUT" HEARTBEAT_INTERVAL_SECONDS="$HEARTBEAT" \
	QUEUE_OVERFLOW_THRESHOLD=$((WAIT_N * 2)) QUEUE_OVERFLOW_HYSTERESIS=500 QUEUE_MAX_PER_IDENTITY=$((WAIT_N * 2)) \
	QUEUE_MAX_BYTES="$QUEUE_MAX_BYTES" ${WAIT_API_ENV:-}
API_PPROF=$PPROF_ADDR
METRICS="http://127.0.0.1:$API_PORT/metrics"
sleep 2 # let start-up allocation settle
IDLE_RSS=$(rss_kib "$API_PID")
IDLE_ANON=$(anon_kib "$API_PID")
log "api idle RSS ${IDLE_RSS} KiB (anonymous ${IDLE_ANON} KiB)"
curl -fsS -m 5 -o "$dir/api.idle.metrics.txt" "$METRICS" || true
# The idle process's own goroutines (Redis, Pub/Sub, the memory returner)
# are not the streams': per stream is (plateau − idle) / WAIT_N, as for RSS.
IDLE_GOR=$(awk '$1 == "go_goroutines" {print $2 + 0}' "$dir/api.idle.metrics.txt" 2>/dev/null || true)
if [[ -n $API_PPROF ]]; then curl -fsS -m 30 -o "$dir/api.idle.heap.pprof" "http://$API_PPROF/debug/pprof/heap?gc=1" || true; fi

load_start waiting $((QUEUE_TIMEOUT + 120)) -url "http://127.0.0.1:$API_PORT/v1/stream" \
	-c "$WAIT_N" -n "$WAIT_N" -ramp "$WAIT_RAMP" -prompts 100 -timeout $((QUEUE_TIMEOUT + 60))s "${IMAGE_ARGS[@]}"
LT=$REPLY

# Sample once a second while the load runs: time, api RSS, open queued
# streams, goroutines, Go heap in use, Redis clients.
echo -e "t_s\trss_kib\tactive_queued\tgoroutines\theap_inuse_bytes\tredis_clients\tstack_inuse_bytes\theap_released_bytes\tredis_used_memory" >"$dir/samples.tsv"
start=$SECONDS plateau_at= plateau=() settled=() peak=0
while kill -0 "$LT" 2>/dev/null; do
	m=$(curl -fsS -m 5 "$METRICS" 2>/dev/null || true)
	active=$(awk '$1 == "spillway_active_streams{path=\"queued\"}" {print $2 + 0}' <<<"$m")
	gor=$(awk '$1 == "go_goroutines" {print $2 + 0}' <<<"$m")
	heap=$(awk '$1 == "go_memstats_heap_inuse_bytes" {printf "%d", $2}' <<<"$m")
	stack=$(awk '$1 == "go_memstats_stack_inuse_bytes" {printf "%d", $2}' <<<"$m")
	released=$(awk '$1 == "go_memstats_heap_released_bytes" {printf "%d", $2}' <<<"$m")
	redis_mem=$(redis-cli -p "$REDIS_PORT" info memory 2>/dev/null | awk -F: '/^used_memory:/ {print $2 + 0}')
	rss=$(rss_kib "$API_PID")
	clients=$(redis-cli -p "$REDIS_PORT" info clients 2>/dev/null | awk -F: '/^connected_clients/ {print $2 + 0}')
	((rss > peak)) && peak=$rss
	echo -e "$((SECONDS - start))\t$rss\t${active:-}\t${gor:-}\t${heap:-}\t${clients:-}\t${stack:-}\t${released:-}\t${redis_mem:-}" >>"$dir/samples.tsv"
	# Later in the plateau, once the burst's admission is PLATEAU_SETTLE
	# seconds behind it: what the waiting streams hold, the ramp's free
	# pages given back (docs/OPERATIONS.md, "Memory after a burst").
	if [[ -n $plateau_at && -n ${active:-} && ${active%.*} -ge $WAIT_N ]] && ((SECONDS - start >= plateau_at + PLATEAU_SETTLE)); then
		settled+=("$rss")
	fi
	if [[ -n ${active:-} && ${active%.*} -ge $WAIT_N && ${#plateau[@]} -lt $PLATEAU_SAMPLES ]]; then
		[[ -z $plateau_at ]] && plateau_at=$((SECONDS - start)) && log "all $WAIT_N streams waiting after ${plateau_at}s"
		plateau+=("$rss")
		PLATEAU_GOR=$gor PLATEAU_HEAP=$heap PLATEAU_CLIENTS=$clients PLATEAU_STACK=${stack:-0} PLATEAU_REDIS_MEM=${redis_mem:-0}
		[[ ${#plateau[@]} -eq 1 ]] && printf '%s\n' "$m" >"$dir/api.plateau.metrics.txt"
		if [[ ${#plateau[@]} -eq 1 && -n $API_PPROF ]]; then
			curl -fsS -m 30 -o "$dir/api.plateau.heap.pprof" "http://$API_PPROF/debug/pprof/heap" || true
			curl -fsS -m 30 -o "$dir/api.plateau.goroutine.pprof" "http://$API_PPROF/debug/pprof/goroutine" || true
		fi
	fi
	sleep 1
done
load_finish waiting
AFTER_RSS=$(rss_kib "$API_PID")
# After the load: does the api give the memory back? RSS once a second
# for AFTER_SECONDS (the goal: within 2x of idle 60 s after the end).
# The RSS comes from /proc every second; /metrics only every
# AFTER_SCRAPE_EVERY seconds (10) and at the end: one scrape allocates
# about 200 KiB, so scraping every second, 15 to 60 times as often as a
# Prometheus does, fills the quiet process with garbage the idle figure
# never had (up to 13 MB a minute, until the next collection).
AFTER_SCRAPE_EVERY=${AFTER_SCRAPE_EVERY:-10}
log "sampling RSS for ${AFTER_SECONDS}s after the load"
echo -e "t_s\trss_kib\tgoroutines\theap_inuse_bytes" >"$dir/after.tsv"
for ((t = 1; t <= AFTER_SECONDS; t++)); do
	sleep 1
	gor= heap=
	if ((t % AFTER_SCRAPE_EVERY == 0 || t == AFTER_SECONDS)); then
		m=$(curl -fsS -m 5 "$METRICS" 2>/dev/null || true)
		gor=$(awk '$1 == "go_goroutines" {print $2 + 0}' <<<"$m")
		heap=$(awk '$1 == "go_memstats_heap_inuse_bytes" {printf "%d", $2}' <<<"$m")
	fi
	echo -e "$t\t$(rss_kib "$API_PID")\t${gor:-}\t${heap:-}" >>"$dir/after.tsv"
done
LATER_RSS=$(rss_kib "$API_PID")
LATER_ANON=$(anon_kib "$API_PID")
curl -fsS -m 5 -o "$dir/api.after.metrics.txt" "$METRICS" || true
if [[ -n $API_PPROF ]]; then
	curl -fsS -m 30 -o "$dir/api.after.heap.pprof" "http://$API_PPROF/debug/pprof/heap?gc=1" || true
	curl -fsS -m 30 -o "$dir/api.after.goroutine.txt" "http://$API_PPROF/debug/pprof/goroutine?debug=1" || true
fi
LATER_GOR=$(awk 'END {print $3 + 0}' "$dir/after.tsv")
[[ -n $plateau_at ]] || die "waiting: the api never held $WAIT_N queued streams at once (see $dir/samples.tsv)"

plateau_json=$(printf '%s\n' "${plateau[@]}" | jq -s .)
settled_json=$( ((${#settled[@]})) && printf '%s\n' "${settled[@]}" | jq -s . || echo '[]')
jq -n --slurpfile run "$dir/waiting.json" --argjson n "$WAIT_N" --argjson idle "$IDLE_RSS" \
	--argjson plateau "$plateau_json" --argjson settled "$settled_json" --argjson peak "$peak" --argjson after "$AFTER_RSS" \
	--argjson later "$LATER_RSS" --argjson later_s "$AFTER_SECONDS" --argjson later_gor "$LATER_GOR" \
	--argjson idle_anon "$IDLE_ANON" --argjson later_anon "$LATER_ANON" \
	--argjson at "$plateau_at" --argjson gor "${PLATEAU_GOR:-0}" --argjson idle_gor "${IDLE_GOR:-0}" --argjson heap "${PLATEAU_HEAP:-0}" --argjson stack "${PLATEAU_STACK:-0}" \
	--argjson clients "${PLATEAU_CLIENTS:-0}" --argjson nofile "$NOFILE" \
	--argjson image "$WAIT_IMAGE_BYTES" --argjson redis_mem "${PLATEAU_REDIS_MEM:-0}" \
	--argjson qt "$QUEUE_TIMEOUT" --argjson hb "$HEARTBEAT" --argjson scrape "$AFTER_SCRAPE_EVERY" "$JQ_DEFS"'
	$run[0] as $r | ($plateau | median) as $pm | {
	scenario: "waiting",
	settings: {streams: $n, image_bytes: $image, queue_timeout_s: $qt, heartbeat_s: $hb, open_files_limit: $nofile, after_scrape_every_s: $scrape},
	rss_kib: {idle: $idle, plateau_median: $pm, plateau_samples: $plateau,
		settled_median: (if ($settled | length) > 0 then ($settled | median) else null end), settled_samples: ($settled | length),
		peak: $peak, after_streams_ended: $after,
		after_seconds: $later_s, after_later: $later},
	rss_after_over_idle: ($later / $idle | r3), goroutines_after_later: $later_gor,
	anon_kib: {idle: $idle_anon, after_later: $later_anon}, anon_after_over_idle: ($later_anon / $idle_anon | r3),
	kib_per_stream: (($pm - $idle) / $n | r3),
	kib_per_stream_peak: (($peak - $idle) / $n | r3),
	kib_per_stream_settled: (if ($settled | length) > 0 then ((($settled | median) - $idle) / $n | r3) else null end),
	plateau_reached_after_s: $at,
	at_plateau: {goroutines: $gor, goroutines_idle: $idle_gor, goroutines_per_stream: (($gor - $idle_gor) / $n | r3), heap_inuse_bytes: $heap,
		heap_bytes_per_stream: ($heap / $n | round), stack_inuse_bytes: $stack, stack_bytes_per_stream: ($stack / $n | round),
		redis_clients: $clients, redis_used_memory_bytes: $redis_mem},
	outcome: {requests: $r.result.requests, errors: $r.result.errors, errors_by_type: $r.result.errors_by_type,
		refused: $r.result.refused, lost: $r.result.lost, lost_by_reason: $r.result.lost_by_reason, exit_code: $r.exit_code},
	pings: $r.result.pings, pings_per_stream: ($r.result.pings / ([$r.result.requests, 1] | max) | r3),
	ping_interval_ms: $r.result.ping_interval, max_gap_ms: $r.result.max_gap,
	load_before: $r.load_before, load_after: $r.load_after}' >"$RESULTS/waiting.json"

jq -r '"waiting: \(.settings.streams) streams, \(.kib_per_stream) KiB/stream (idle \(.rss_kib.idle), plateau \(.rss_kib.plateau_median) KiB, \(.rss_kib.after_seconds)s after the load \(.rss_kib.after_later) KiB = \(.rss_after_over_idle)x idle), \(.at_plateau.goroutines_per_stream) goroutines/stream, ping interval p50 \(.ping_interval_ms.p50_ms)ms p99 \(.ping_interval_ms.p99_ms)ms max \(.ping_interval_ms.max_ms)ms, errors \(.outcome.errors), lost \(.outcome.lost)"' \
	"$RESULTS/waiting.json" >&2
jq -e '.outcome.lost == 0 and .outcome.refused == 0 and
	(.outcome.errors_by_type | to_entries | all(.key | endswith("/queue-timeout")))' "$RESULTS/waiting.json" >/dev/null ||
	die "waiting: streams lost, refused or ended otherwise than by queue-timeout (see $RESULTS/waiting.json)"
