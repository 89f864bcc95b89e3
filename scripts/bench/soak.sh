#!/usr/bin/env bash
# soak.sh: one api process under sustained load for minutes, behind
# `make soak` (not part of `make test` or `make bench`). It answers: does
# the api hold its throughput minute after minute, does it never mistake a
# busy Redis for a gone one, and do its goroutines and memory come back
# after the load? (docs/BENCHMARKS.md, "Soak".)
#
# On loopback: one redis-server, one simllm answering SOAK_TOKENS (50)
# chunks with no pause, one api with the Redis pool (CONNECTION_POOL_SIZE
# 100000, CONNECTION_POOL_PER_USER SOAK_PER_USER, rate limit off) and one
# consumer (WORKER_CONCURRENCY SOAK_WORKERS) on the same Redis. The load
# tool keeps SOAK_C (200) closed-loop clients busy and verifies every
# stream, one minute at a time so each minute reports on its own:
#
#   warm-up   SOAK_WARMUP_SECONDS (15) of the direct load and as long of
#             the mix (when there is one), so that both paths have been
#             used, then SOAK_SETTLE_SECONDS (30) idle: the "start" snapshot;
#   direct    SOAK_DIRECT_MINUTES (5): requests spread over SOAK_DIRECT_USERS
#             (200) identities, so no identity comes near its limit and
#             every stream goes direct;
#   mix       SOAK_MIX_MINUTES (2): the same api, requests spread over
#             SOAK_MIX_USERS (10) identities, about SOAK_C / SOAK_MIX_USERS
#             (20) streams each against a limit of SOAK_PER_USER (5): about
#             half find their identity full and go through the queue;
#   after     the "end" snapshot as the load stops, the "+60 s" one
#             SOAK_AFTER_SECONDS (60) later.
#
# Per minute: streams/s, first-chunk p50/p99, errors, refusals and lost
# streams, the paths taken and the spills to the queue by cause (busy:
# the pool's acquire timed out; user: the identity was full), the
# consumer's mean queue wait, the api's and Redis's CPU per stream, Redis
# memory, the api's mean pool-script latency
# (spillway_redis_command_seconds{op="evalsha"}), the highest
# spillway_pool_fallback sampled every SOAK_SAMPLE_SECONDS (2) and the "Redis
# gone" lines the api and the consumer logged, the pool leases still live a
# second after the minute's last stream ended, goroutines and RSS, and the
# load averages. SOAK_SKIP_BUILD=1 uses bin/ as it is. Checks, each failing the run (exit 1):
#   - no stream lost, failed or refused;
#   - no fallback: spillway_pool_fallback never 1, no "Redis gone" line;
#   - streams/s of the last direct minute ≥ (1 − SOAK_TPUT_TOLERANCE) ×
#     the first's (0.10);
#   - the mix used both paths;
#   - no Redis pool lease or waiter is left 12 s after the load, once the
#     renewal round has retried the releases that timed out: one left then
#     is held by nobody and takes a slot until it expires;
#   - 60 s after the load, goroutines ≤ start + SOAK_GOROUTINE_SLACK (20)
#     and RSS ≤ start × (1 + SOAK_RSS_TOLERANCE) (0.25). Goroutines are
#     compared net of the upstream connections the api keeps idle (two
#     goroutines each, closed after 90 s idle), counted with ss: their
#     number follows the last load's peak, not a leak.
#
# Writes $RESULTS/machine.json, $RESULTS/soak/*.json (each minute's load
# run), $RESULTS/soak/samples.tsv, $RESULTS/soak.json and soak.txt (the
# table). BENCH_PROFILE=1 also saves heap and goroutine profiles of the api
# at start, end and +60 s, and 20 s CPU profiles in the first and last
# direct minute (compare with go tool pprof -base). SOAK_MINUTE_SECONDS
# (60) shortens the "minutes" for a trial of the script itself.
source "$(dirname "$0")/lib.sh"
SCENARIO=soak
require_tools go jq curl redis-server redis-cli ss timeout

num() { [[ $2 =~ ^[0-9]+$ ]] || die "$1=$2: want a whole number"; }
SOAK_DIRECT_MINUTES=${SOAK_DIRECT_MINUTES:-5}
SOAK_MIX_MINUTES=${SOAK_MIX_MINUTES:-2}
SOAK_MINUTE_SECONDS=${SOAK_MINUTE_SECONDS:-60}
SOAK_C=${SOAK_C:-200}
SOAK_TOKENS=${SOAK_TOKENS:-50}
SOAK_DIRECT_USERS=${SOAK_DIRECT_USERS:-200}
SOAK_MIX_USERS=${SOAK_MIX_USERS:-10}
SOAK_PER_USER=${SOAK_PER_USER:-5}
SOAK_WORKERS=${SOAK_WORKERS:-128}
SOAK_WARMUP_SECONDS=${SOAK_WARMUP_SECONDS:-15}
SOAK_SETTLE_SECONDS=${SOAK_SETTLE_SECONDS:-30}
SOAK_AFTER_SECONDS=${SOAK_AFTER_SECONDS:-60}
SOAK_SAMPLE_SECONDS=${SOAK_SAMPLE_SECONDS:-2}
SOAK_GOROUTINE_SLACK=${SOAK_GOROUTINE_SLACK:-20}
SOAK_TPUT_TOLERANCE=${SOAK_TPUT_TOLERANCE:-0.10}
SOAK_RSS_TOLERANCE=${SOAK_RSS_TOLERANCE:-0.25}
for v in SOAK_DIRECT_MINUTES SOAK_MIX_MINUTES SOAK_MINUTE_SECONDS SOAK_C SOAK_TOKENS SOAK_DIRECT_USERS \
	SOAK_MIX_USERS SOAK_PER_USER SOAK_WORKERS SOAK_WARMUP_SECONDS SOAK_SETTLE_SECONDS SOAK_AFTER_SECONDS \
	SOAK_SAMPLE_SECONDS SOAK_GOROUTINE_SLACK; do
	num "$v" "${!v}"
done
for v in SOAK_TPUT_TOLERANCE SOAK_RSS_TOLERANCE; do
	[[ ${!v} =~ ^0?\.[0-9]+$|^[01]$ ]] || die "$v=${!v}: want a fraction between 0 and 1"
done
((SOAK_DIRECT_MINUTES >= 1)) || die "SOAK_DIRECT_MINUTES must be at least 1"
((SOAK_MINUTE_SECONDS >= 5 && SOAK_C >= 1 && SOAK_TOKENS >= 1 && SOAK_SAMPLE_SECONDS >= 1)) ||
	die "SOAK_MINUTE_SECONDS ≥ 5, SOAK_C, SOAK_TOKENS and SOAK_SAMPLE_SECONDS ≥ 1"
((SOAK_MIX_USERS >= 1 && SOAK_DIRECT_USERS >= 1 && SOAK_PER_USER >= 1 && SOAK_WORKERS >= 1)) ||
	die "SOAK_*_USERS, SOAK_PER_USER and SOAK_WORKERS must be at least 1"

if [[ ${SOAK_SKIP_BUILD:-0} != 1 ]]; then
	log "building into $BIN"
	(cd "$ROOT" && go build -o "$BIN/" ./cmd/...)
fi
machine_json >"$RESULTS/machine.json"
git -C "$ROOT" status --porcelain >"$RESULTS/git-status.txt" 2>/dev/null || true
dir="$RESULTS/$SCENARIO"
mkdir -p "$dir"
log "soak: results in $RESULTS; machine: $(jq -c . "$RESULTS/machine.json")"

pool_env=(CONNECTION_POOL_SIZE=100000 CONNECTION_POOL_PER_USER="$SOAK_PER_USER" RATE_LIMIT_RPS=0)
start_redis
start_simllm simllm 0 0 "$SOAK_TOKENS"
start_api api "${pool_env[@]}"
API_PPROF=$PPROF_ADDR
API_LOG="$RESULTS/logs/api.log"
METRICS="http://127.0.0.1:$API_PORT/metrics"
URL="http://127.0.0.1:$API_PORT/v1/stream"
start_consumer consumer "${pool_env[@]}" WORKER_CONCURRENCY="$SOAK_WORKERS"
CONSUMER_LOG="$RESULTS/logs/consumer.log"
CPU_PID=([api]=$API_PID [consumer]=$CONSUMER_PID [redis]=$REDIS_PID [simllm]=$SIM_PID)

# gone_lines prints how many times the api and the consumer logged that
# Redis is gone (the pool, the upstream caps or the quotas falling back).
gone_lines() { cat "$API_LOG" "$CONSUMER_LOG" 2>/dev/null | grep -c 'Redis gone' || true; }

# sample_of TEXT NAME prints one sample's value from a /metrics text (0
# when absent).
sample_of() { awk -v m="$2" '$1 == m {v = $2} END {printf "%.6f\n", v + 0}' <<<"$1"; }

# sample [LABEL]: one line of samples.tsv (api goroutines, RSS, heap in use,
# fallback gauge, evalsha count and sum, "Redis gone" lines, load); the
# values are also left in S_* and the api's /metrics text in S_METRICS.
echo -e "t_s\tlabel\tgoroutines\trss_kib\theap_inuse_bytes\tpool_fallback\tevalsha_count\tevalsha_sum_s\tgone_lines\tload" >"$dir/samples.tsv"
T0=$SECONDS
sample() {
	local m
	m=$(curl -fsS -m 5 "$METRICS" 2>/dev/null || true)
	grep -q '^go_goroutines ' <<<"$m" || die "api metrics unreadable at $METRICS"
	S_METRICS=$m
	S_GOR=$(awk '$1 == "go_goroutines" {print $2 + 0}' <<<"$m")
	S_HEAP=$(awk '$1 == "go_memstats_heap_inuse_bytes" {printf "%d", $2}' <<<"$m")
	S_FALLBACK=$(awk '$1 == "spillway_pool_fallback" {print $2 + 0}' <<<"$m")
	S_EVC=$(sample_of "$m" 'spillway_redis_command_seconds_count{op="evalsha"}')
	S_EVS=$(sample_of "$m" 'spillway_redis_command_seconds_sum{op="evalsha"}')
	S_RSS=$(rss_kib "$API_PID")
	S_GONE=$(gone_lines)
	echo -e "$((SECONDS - T0))\t${1:-}\t$S_GOR\t$S_RSS\t${S_HEAP:-0}\t${S_FALLBACK:-0}\t$S_EVC\t$S_EVS\t$S_GONE\t$(loadavg)" >>"$dir/samples.tsv"
}

# counters_json: the api and consumer counters a minute reports as
# differences (pool refusals by limit, evalsha calls and seconds, the
# consumer's queue wait), from S_METRICS and the consumer's /metrics.
counters_json() {
	local c
	c=$(curl -fsS -m 5 "http://127.0.0.1:$CONSUMER_PORT/metrics" 2>/dev/null || true)
	jq -n --argjson rg "$(sample_of "$S_METRICS" 'spillway_pool_refusals_total{limit="global"}')" \
		--argjson ru "$(sample_of "$S_METRICS" 'spillway_pool_refusals_total{limit="user"}')" \
		--argjson ec "$(sample_of "$S_METRICS" 'spillway_redis_command_seconds_count{op="evalsha"}')" \
		--argjson es "$(sample_of "$S_METRICS" 'spillway_redis_command_seconds_sum{op="evalsha"}')" \
		--argjson qc "$(sample_of "$c" spillway_queue_wait_seconds_count)" \
		--argjson qs "$(sample_of "$c" spillway_queue_wait_seconds_sum)" \
		'{refused_global: $rg, refused_user: $ru, evalsha_count: $ec, evalsha_sum: $es, queue_wait_count: $qc, queue_wait_sum: $qs}'
}

# live_pool_entries leases|waiters prints how many entries of the Redis
# pool's leases or waiters set have not expired.
live_pool_entries() {
	local now
	now=$(redis-cli -p "$REDIS_PORT" time | head -1)
	redis-cli -p "$REDIS_PORT" zcount "queue:pool:{pool}:$1" "$((now * 1000))" +inf
}

# upstream_conns prints how many connections the api holds open to simllm
# (idle ones between loads: the transport keeps them for reuse).
upstream_conns() {
	ss -Htnp state established "( dport = :$SIM_PORT )" 2>/dev/null | grep -c "pid=$API_PID," || true
}

# snapshot NAME: a labelled sample kept as JSON in $dir/snap-NAME.json,
# plus heap and goroutine profiles when profiling.
snapshot() {
	sample "$1"
	local up clients
	up=$(upstream_conns)
	clients=$(ss -Htn state established "( sport = :$API_PORT )" 2>/dev/null | wc -l)
	jq -n --arg name "$1" --argjson gor "$S_GOR" --argjson rss "$S_RSS" --argjson heap "${S_HEAP:-0}" \
		--argjson up "$up" --argjson clients "$clients" --arg load "$(loadavg)" --argjson t "$((SECONDS - T0))" \
		'{snapshot: $name, t_s: $t, goroutines: $gor, upstream_conns: $up, client_conns: $clients,
		  goroutines_net: ($gor - 2 * $up), rss_kib: $rss, heap_inuse_bytes: $heap, load: $load}' >"$dir/snap-$1.json"
	if [[ -n $API_PPROF ]]; then
		curl -fsS -m 30 -o "$dir/api.$1.heap.pprof" "http://$API_PPROF/debug/pprof/heap" || true
		curl -fsS -m 30 -o "$dir/api.$1.goroutine.pprof" "http://$API_PPROF/debug/pprof/goroutine" || true
	fi
	log "snapshot $1: goroutines $S_GOR ($up upstream connections, $clients client connections), RSS $S_RSS KiB, heap in use $((${S_HEAP:-0} / 1024)) KiB, load $(loadavg)"
}

common=(-url "$URL" -c "$SOAK_C" -n 0 -tokens "$SOAK_TOKENS" -seed 1 -prompts 200 -timeout 60s -verify)

# minute NAME PHASE USERS [CPU_PROFILE_NAME]: SOAK_MINUTE_SECONDS of load,
# sampled meanwhile; writes $dir/NAME.json (the load run) and
# $dir/NAME.minute.json (the minute's row).
minute() {
	local name=$1 phase=$2 users=$3 cpuprof=${4:-} prof= fb_max=0 gone0 c0 c1 next
	sample "$name-start"
	gone0=$S_GONE
	c0=$(counters_json)
	if [[ -n $cpuprof && -n $API_PPROF ]]; then
		save_profile "http://$API_PPROF/debug/pprof/profile?seconds=20" "$dir/api.$cpuprof.cpu.pprof"
		prof=$REPLY
	fi
	load_start "$name" $((SOAK_MINUTE_SECONDS + 60)) "${common[@]}" -d "${SOAK_MINUTE_SECONDS}s" -users "$users"
	local lt=$REPLY
	next=$SECONDS
	while kill -0 "$lt" 2>/dev/null; do
		if ((SECONDS >= next)); then
			sample "$name"
			((S_FALLBACK > fb_max)) && fb_max=$S_FALLBACK
			next=$((SECONDS + SOAK_SAMPLE_SECONDS))
		fi
		sleep 0.2
	done
	load_finish "$name"
	[[ -n $prof ]] && wait_pid "$prof"
	# Every stream of the minute has ended: a lease still live in Redis a
	# second later is held by nobody (or its release timed out and waits
	# for the renewal round), and takes a slot until it expires.
	sleep 1
	local idle_leases
	idle_leases=$(live_pool_entries leases)
	sample "$name-end"
	((S_FALLBACK > fb_max)) && fb_max=$S_FALLBACK
	c1=$(counters_json)
	local rmem rkeys
	rmem=$(redis-cli -p "$REDIS_PORT" info memory 2>/dev/null | awk -F: '/^used_memory:/ {printf "%d", $2}')
	rkeys=$(redis-cli -p "$REDIS_PORT" dbsize 2>/dev/null || echo 0)
	jq --arg phase "$phase" --argjson users "$users" --argjson fb "$fb_max" \
		--argjson gone "$((S_GONE - gone0))" --argjson gor "$S_GOR" --argjson rss "$S_RSS" \
		--argjson c0 "$c0" --argjson c1 "$c1" --argjson il "$idle_leases" --argjson rmem "${rmem:-0}" --argjson rkeys "${rkeys:-0}" \
		"$JQ_DEFS"'.result as $r | ($c1 | with_entries(.value -= $c0[.key])) as $d | {
		minute: .run, phase: $phase, users: $users,
		streams_per_s: (if $r.elapsed_seconds > 0 then $r.done / $r.elapsed_seconds | . * 10 | round / 10 else null end),
		done: $r.done, errors: $r.errors, refused: $r.refused, lost: $r.lost, errors_by_type: $r.errors_by_type,
		lost_by_reason: $r.lost_by_reason, paths: $r.paths,
		queued_share: (if $r.done > 0 then (($r.paths.queued // 0) / $r.done | r3) else null end),
		first_chunk_p50_ms: ($r.latency.all.first_chunk.p50_ms | r3), first_chunk_p99_ms: ($r.latency.all.first_chunk.p99_ms | r3),
		total_p50_ms: ($r.latency.all.total.p50_ms | r3),
		api_cpu_us_per_stream: (if $r.done > 0 and .cpu_seconds.api != null then .cpu_seconds.api * 1e6 / $r.done | round else null end),
		redis_cpu_us_per_stream: (if $r.done > 0 and .cpu_seconds.redis != null then .cpu_seconds.redis * 1e6 / $r.done | round else null end),
		cpu_seconds: .cpu_seconds, redis_used_memory_mib: ($rmem / 1048576 | . * 10 | round / 10), redis_keys: $rkeys,
		pool_refusals: {global: $d.refused_global, user: $d.refused_user},
		evalsha_calls: $d.evalsha_count, evalsha_mean_ms: (if $d.evalsha_count > 0 then $d.evalsha_sum * 1000 / $d.evalsha_count | r3 else null end),
		queue_wait_mean_ms: (if $d.queue_wait_count > 0 then $d.queue_wait_sum * 1000 / $d.queue_wait_count | r3 else null end),
		fallback_max: $fb, redis_gone_lines: $gone, leases_live_after: $il, goroutines_after: $gor, rss_kib_after: $rss,
		load_before: .load_before, load_after: .load_after, exit_code}' "$dir/$name.json" >"$dir/$name.minute.json"
	log "$name: $(jq -r '"\(.streams_per_s)/s, first chunk p99 \(.first_chunk_p99_ms)ms, queued \(.paths.queued // 0), api CPU \(.api_cpu_us_per_stream)µs/stream, evalsha \(.evalsha_mean_ms)ms, fallback \(.fallback_max), gone \(.redis_gone_lines), idle leases \(.leases_live_after)"' "$dir/$name.minute.json")"
}

snapshot fresh
log "warm-up: ${SOAK_WARMUP_SECONDS}s, then ${SOAK_SETTLE_SECONDS}s idle"
run_load warmup-direct $((SOAK_WARMUP_SECONDS + 60)) "${common[@]}" -d "${SOAK_WARMUP_SECONDS}s" -users "$SOAK_DIRECT_USERS"
if ((SOAK_MIX_MINUTES > 0)); then
	run_load warmup-mix $((SOAK_WARMUP_SECONDS + 60)) "${common[@]}" -d "${SOAK_WARMUP_SECONDS}s" -users "$SOAK_MIX_USERS"
fi
sleep "$SOAK_SETTLE_SECONDS"
snapshot start

minutes=()
for ((i = 1; i <= SOAK_DIRECT_MINUTES; i++)); do
	prof=
	((i == 1)) && prof=first-direct
	((i == SOAK_DIRECT_MINUTES && i > 1)) && prof=last-direct
	minute "direct-$i" direct "$SOAK_DIRECT_USERS" "$prof"
	minutes+=("$dir/direct-$i.minute.json")
done
for ((i = 1; i <= SOAK_MIX_MINUTES; i++)); do
	minute "mix-$i" mix "$SOAK_MIX_USERS"
	minutes+=("$dir/mix-$i.minute.json")
done
snapshot end
LEASES_END=$(live_pool_entries leases) WAITERS_END=$(live_pool_entries waiters)
# A lease still live once every stream has ended and the renewal round
# (every 10 s) has retried the releases that timed out is held by nobody.
orphan_wait=$((SOAK_AFTER_SECONDS < 12 ? SOAK_AFTER_SECONDS : 12))
sleep "$orphan_wait"
LEASES_ORPHAN=$(live_pool_entries leases) WAITERS_ORPHAN=$(live_pool_entries waiters)
log "pool entries after the load: leases $LEASES_END, waiters $WAITERS_END; ${orphan_wait}s later leases $LEASES_ORPHAN, waiters $WAITERS_ORPHAN"
sleep $((SOAK_AFTER_SECONDS - orphan_wait))
snapshot after
GONE_TOTAL=$(gone_lines)

jq -n --slurpfile m "$RESULTS/machine.json" --slurpfile rows <(cat "${minutes[@]}") \
	--slurpfile fresh "$dir/snap-fresh.json" --slurpfile start "$dir/snap-start.json" \
	--slurpfile fin "$dir/snap-end.json" --slurpfile after "$dir/snap-after.json" \
	--argjson gone "$GONE_TOTAL" --argjson tt "$SOAK_TPUT_TOLERANCE" --argjson rt "$SOAK_RSS_TOLERANCE" \
	--argjson gs "$SOAK_GOROUTINE_SLACK" --argjson le "$LEASES_END" --argjson we "$WAITERS_END" \
	--argjson lo "$LEASES_ORPHAN" --argjson wo "$WAITERS_ORPHAN" --argjson ow "$orphan_wait" \
	--argjson settings "$(jq -n --argjson dm "$SOAK_DIRECT_MINUTES" --argjson mm "$SOAK_MIX_MINUTES" \
		--argjson ms "$SOAK_MINUTE_SECONDS" --argjson c "$SOAK_C" --argjson tok "$SOAK_TOKENS" \
		--argjson du "$SOAK_DIRECT_USERS" --argjson mu "$SOAK_MIX_USERS" --argjson pu "$SOAK_PER_USER" \
		--argjson w "$SOAK_WORKERS" --argjson wu "$SOAK_WARMUP_SECONDS" --argjson st "$SOAK_SETTLE_SECONDS" \
		--argjson af "$SOAK_AFTER_SECONDS" \
		'{direct_minutes: $dm, mix_minutes: $mm, minute_seconds: $ms, clients: $c, tokens: $tok,
		  sim_first_token_ms: 0, sim_token_ms: 0, pool_size: 100000, per_user_limit: $pu,
		  direct_users: $du, mix_users: $mu, worker_concurrency: $w, warmup_s: $wu, settle_s: $st, after_s: $af}')" \
	"$JQ_DEFS"'
	($rows | map(select(.phase == "direct"))) as $d | ($rows | map(select(.phase == "mix"))) as $x
	| ($start[0]) as $s | ($after[0]) as $a
	| def check(name; value; limit; ok): {check: name, value: value, limit: limit, ok: ok};
	{scenario: "soak", machine: $m[0], settings: $settings, minutes: $rows,
	 snapshots: {fresh: $fresh[0], start: $s, "end": $fin[0], after: $a},
	 pool_after_load: {leases_at_end: $le, waiters_at_end: $we, wait_s: $ow, leases_held_by_nobody: $lo, waiters_left: $wo},
	 totals: {done: ($rows | map(.done) | add), errors: ($rows | map(.errors) | add),
	          refused: ($rows | map(.refused) | add), lost: ($rows | map(.lost) | add),
	          queued: ($rows | map(.paths.queued // 0) | add), redis_gone_lines: $gone,
	          fallback_max: ($rows | map(.fallback_max) | max),
	          idle_leases_after_minutes: ($rows | map(.leases_live_after) | add)},
	 checks: [
		check("no stream lost, failed or refused"; ($rows | map(.lost + .errors + .refused) | add); 0;
			($rows | all(.lost == 0 and .errors == 0 and .refused == 0))),
		check("no fallback (spillway_pool_fallback never 1, no \"Redis gone\" line)";
			(($rows | map(.fallback_max) | max) + $gone); 0; (($rows | all(.fallback_max == 0)) and $gone == 0)),
		check("streams/s, last direct minute ÷ first"; ($d[-1].streams_per_s / $d[0].streams_per_s | r3); (1 - $tt);
			($d[-1].streams_per_s >= (1 - $tt) * $d[0].streams_per_s)),
		(if ($x | length) > 0 then
			check("the mix used both paths (queued share)"; ($x | map(.queued_share) | median); "0 < share < 1";
				($x | all(.queued_share > 0 and .queued_share < 1)))
		 else empty end),
		check("no pool lease or waiter left \($ow)s after the load (held by nobody)"; ($lo + $wo); 0; ($lo + $wo == 0)),
		check("goroutines +\($settings.after_s)s after the load − start, net of idle upstream connections";
			($a.goroutines_net - $s.goroutines_net); $gs; ($a.goroutines_net <= $s.goroutines_net + $gs)),
		check("RSS +\($settings.after_s)s after the load ÷ start"; ($a.rss_kib / $s.rss_kib | r3); (1 + $rt);
			($a.rss_kib <= (1 + $rt) * $s.rss_kib))
	 ]}
	| .ok = (.checks | all(.ok))' >"$RESULTS/soak.json"

jq -r '
	def pad(n): tostring | if length < n then " " * (n - length) + . else . end;
	"machine: \(.machine.cpu), \(.machine.nproc) cores, commit \(.machine.commit) (+\(.machine.uncommitted_files) uncommitted), \(.machine.date)",
	"settings: \(.settings.clients) clients, \(.settings.tokens) chunks/answer, \(.settings.minute_seconds)s minutes, direct users \(.settings.direct_users), mix users \(.settings.mix_users) at \(.settings.per_user_limit) each",
	"",
	"minute      streams/s  fc p50 ms  fc p99 ms  queued%  q wait ms  err/ref/lost  spills busy/user  api µs/stream  redis µs/stream  redis MiB  evalsha ms  fallback  gone  idle leases  goroutines  RSS KiB  load before",
	(.minutes[] | "\(.minute | . + " " * (10 - length)) \(.streams_per_s | pad(10)) \(.first_chunk_p50_ms | pad(10)) \(.first_chunk_p99_ms | pad(10)) \((.queued_share // 0) * 100 | round | pad(8)) \(.queue_wait_mean_ms // "-" | pad(10)) \("\(.errors)/\(.refused)/\(.lost)" | pad(13)) \("\(.pool_refusals.global)/\(.pool_refusals.user)" | pad(17)) \(.api_cpu_us_per_stream | pad(14)) \(.redis_cpu_us_per_stream | pad(16)) \(.redis_used_memory_mib | pad(10)) \(.evalsha_mean_ms | pad(11)) \(.fallback_max | pad(9)) \(.redis_gone_lines | pad(5)) \(.leases_live_after | pad(12)) \(.goroutines_after | pad(11)) \(.rss_kib_after | pad(8))  \(.load_before)"),
	"",
	"api        goroutines  upstream conns  net goroutines  RSS KiB  heap in use KiB  load",
	(.snapshots | to_entries[] | "\(.key | . + " " * (10 - length)) \(.value.goroutines | pad(10)) \(.value.upstream_conns | pad(15)) \(.value.goroutines_net | pad(15)) \(.value.rss_kib | pad(8)) \(.value.heap_inuse_bytes / 1024 | round | pad(16))  \(.value.load)"),
	"pool after the load: \(.pool_after_load.leases_at_end) leases and \(.pool_after_load.waiters_at_end) waiters at the end, \(.pool_after_load.leases_held_by_nobody) leases and \(.pool_after_load.waiters_left) waiters \(.pool_after_load.wait_s)s later",
	"",
	(.checks[] | "\(if .ok then "OK  " else "FAIL" end) \(.check): \(.value) (limit \(.limit))"),
	"verdict: \(if .ok then "PASS" else "FAIL" end)"' "$RESULTS/soak.json" | tee "$RESULTS/soak.txt"
log "results in $RESULTS"
jq -e '.ok' "$RESULTS/soak.json" >/dev/null || die "soak: a check failed (see $RESULTS/soak.txt)"
