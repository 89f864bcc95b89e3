#!/usr/bin/env bash
# queuedcpu.sh: the queued path's server CPU per stream, this build beside
# another (issue 16, docs/BENCHMARKS.md "The queued path's CPU").
#
# One redis-server, one paced simllm, an api streaming direct (this build:
# the reference "added" time is measured against), and for this build and,
# when BASELINE_BIN names another build's directory (its api and consumer),
# for that one: an api with DIRECT_PATH_ENABLED=false and two consumers
# (WORKER_CONCURRENCY=128, default batching), each pair on its own
# QUEUE_PREFIX. Rounds interleave direct, queued (this build), queued-base;
# every run records the CPU seconds of each process, so the CPU per stream
# of the api, the consumers and Redis is read off the run that used them.
# With BENCH_PROFILE=1 the first round also takes a CPU profile of each
# queued api and of its first consumer during its run (queuedcpu/*.pprof,
# with `go tool pprof -top` text beside them).
#
# Part 2 (TPUT=1, the default): relay throughput as queued.sh's part 2
# (unpaced simllm, TPUT_TOKENS chunks, TPUT_C concurrent, batch TPUT_BATCH),
# both builds interleaved, TPUT_ROUNDS rounds.
#
# Writes $RESULTS/queuedcpu/*.json and $RESULTS/queuedcpu.json (summary).
# Environment: PAIRS (3), CONC (50), NC (2000), SIM_* (50/5/16),
# BASELINE_BIN, TPUT (1), TPUT_C (64), TPUT_N (1500), TPUT_TOKENS (64),
# TPUT_BATCH (20), TPUT_ROUNDS (2), PROFILE_SECONDS (5).
source "$(dirname "$0")/lib.sh"
SCENARIO=queuedcpu
require_tools jq curl redis-server redis-cli ss

PAIRS=${PAIRS:-3}
CONC=${CONC:-50}
NC=${NC:-2000}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-5} TOK=${SIM_TOKENS:-16}
TPUT=${TPUT:-1}
TPUT_C=${TPUT_C:-64} TPUT_N=${TPUT_N:-1500} TPUT_TOKENS=${TPUT_TOKENS:-64} TPUT_BATCH=${TPUT_BATCH:-20}
TPUT_ROUNDS=${TPUT_ROUNDS:-2}
PROFILE_SECONDS=${PROFILE_SECONDS:-5}
dir="$RESULTS/$SCENARIO"
mkdir -p "$dir"

worker_env=(CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000 WORKER_CONCURRENCY=128)
labels=(new)
[[ -n ${BASELINE_BIN:-} ]] && labels+=(base)
declare -A URL APPROF CPPROF APIBIN CONSBIN
APIBIN[new]=$BIN/api CONSBIN[new]=$BIN/consumer
if [[ -n ${BASELINE_BIN:-} ]]; then
	APIBIN[base]=$BASELINE_BIN/api CONSBIN[base]=$BASELINE_BIN/consumer
fi

# start_queued LABEL [VAR=value...]: a queued api of LABEL's build and its
# two consumers, under QUEUE_PREFIX q<LABEL>:.
start_queued() {
	local l=$1 i
	shift
	API_BIN=${APIBIN[$l]} start_api "api-$l" DIRECT_PATH_ENABLED=false QUEUE_MAX_PER_IDENTITY=1000 "QUEUE_PREFIX=q$l:" "$@"
	URL[$l]="http://127.0.0.1:$API_PORT/v1/stream" APPROF[$l]=$PPROF_ADDR
	CPU_PID[api_$l]=$API_PID
	for i in 1 2; do
		CONSUMER_BIN=${CONSBIN[$l]} start_consumer "consumer-$l-$i" "QUEUE_PREFIX=q$l:" "${worker_env[@]}" "$@"
		CPU_PID[consumer_${l}_$i]=$CONSUMER_PID
		if ((i == 1)); then CPPROF[$l]=$PPROF_ADDR; fi
	done
}

# redis_calls prints Redis' command counters as "command calls usec" lines.
redis_calls() {
	redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
		sed -n 's/^cmdstat_\([^:]*\):calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2 \3/p'
}

# counted_run NAME LOADTEST_ARGS...: run_load, then writes NAME.redis.json:
# per Redis command, the calls and the server µs of the run per stream.
counted_run() {
	local name=$1 before
	before=$(redis_calls)
	run_load "$@"
	join -a2 -e0 -o 2.1,1.2,1.3,2.2,2.3 <(sort <<<"$before") <(redis_calls | sort) |
		awk -v n="$(jq .result.done "$dir/$name.json")" 'n > 0 && $4 > $2 {
			printf "%s{\"command\": \"%s\", \"calls_per_stream\": %.3f, \"usec_per_stream\": %.2f}", sep, $1, ($4 - $2) / n, ($5 - $3) / n; sep = ",\n"}
			BEGIN {print "["} END {print "]"}' | jq 'sort_by(-.calls_per_stream)' >"$dir/$name.redis.json"
}

# profile_run NAME LABEL LOADTEST_ARGS...: run_load, taking CPU profiles of
# LABEL's api and first consumer meanwhile when profiling.
profile_run() {
	local name=$1 l=$2 p1= p2=
	shift 2
	if [[ $BENCH_PROFILE == 1 && -n ${APPROF[$l]} ]]; then
		save_profile "http://${APPROF[$l]}/debug/pprof/profile?seconds=$PROFILE_SECONDS" "$dir/$name.api.cpu.pprof"
		p1=$REPLY
		save_profile "http://${CPPROF[$l]}/debug/pprof/profile?seconds=$PROFILE_SECONDS" "$dir/$name.consumer.cpu.pprof"
		p2=$REPLY
	fi
	counted_run "$name" 180 "$@"
	if [[ -n $p1 ]]; then
		wait_pid "$p1"
		wait_pid "$p2"
		if command -v go >/dev/null; then
			go tool pprof -top -nodecount=40 "${APIBIN[$l]}" "$dir/$name.api.cpu.pprof" >"$dir/$name.api.top.txt" 2>/dev/null || true
			go tool pprof -top -cum -nodecount=80 "${APIBIN[$l]}" "$dir/$name.api.cpu.pprof" >"$dir/$name.api.cum.txt" 2>/dev/null || true
			go tool pprof -top -nodecount=40 "${CONSBIN[$l]}" "$dir/$name.consumer.cpu.pprof" >"$dir/$name.consumer.top.txt" 2>/dev/null || true
			go tool pprof -top -cum -nodecount=80 "${CONSBIN[$l]}" "$dir/$name.consumer.cpu.pprof" >"$dir/$name.consumer.cum.txt" 2>/dev/null || true
		fi
	fi
}

# --- part 1: CPU per stream and added first chunk at CONC ---
start_redis
start_simllm simllm "$FT" "$TI" "$TOK"
CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID)
start_api api-direct CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000
URL[direct]="http://127.0.0.1:$API_PORT/v1/stream"
CPU_PID[api_direct]=$API_PID
for l in "${labels[@]}"; do start_queued "$l"; done

common=(-tokens "$TOK" -seed 1 -prompts 200 -timeout 60s)
log "warm-up"
run_load warmup-direct 60 -url "${URL[direct]}" -c 200 -n 1000 "${common[@]}"
for l in "${labels[@]}"; do run_load "warmup-$l" 60 -url "${URL[$l]}" -c 200 -n 1000 "${common[@]}"; done

for ((i = 1; i <= PAIRS; i++)); do
	run_load "c$CONC-p$i-direct" 120 -url "${URL[direct]}" -c "$CONC" -n "$NC" "${common[@]}"
	for l in "${labels[@]}"; do
		if ((i == 1)); then
			profile_run "c$CONC-p$i-$l" "$l" -url "${URL[$l]}" -c "$CONC" -n "$NC" "${common[@]}"
		else
			counted_run "c$CONC-p$i-$l" 120 -url "${URL[$l]}" -c "$CONC" -n "$NC" "${common[@]}"
		fi
	done
done
stop_all

# --- part 2: relay throughput ---
if [[ $TPUT == 1 ]]; then
	CPU_PID=()
	start_redis
	start_simllm simllm-fast 0 0 "$TPUT_TOKENS"
	CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID)
	for l in "${labels[@]}"; do start_queued "$l" QUEUE_FAILOVER_CHUNK_BATCH_SIZE="$TPUT_BATCH"; done
	tcommon=(-tokens "$TPUT_TOKENS" -seed 1 -prompts 200 -timeout 60s -c "$TPUT_C")
	for l in "${labels[@]}"; do run_load "tput-warmup-$l" 60 -url "${URL[$l]}" -n 300 "${tcommon[@]}"; done
	for ((i = 1; i <= TPUT_ROUNDS; i++)); do
		for l in "${labels[@]}"; do
			counted_run "tput-p$i-$l" 180 -url "${URL[$l]}" -n "$TPUT_N" "${tcommon[@]}"
		done
	done
fi

# --- summary ---
# Per label: per run, first chunk p50/p99, streams/s and CPU ms per stream
# of the api, the two consumers together and Redis; medians over runs; and
# the added first chunk (queued minus the same round's direct); and each
# one's CPU over simllm's in the same run (over_simllm): simllm does the
# same work in every run, so the ratio takes out most of the drift between
# rounds on a shared machine (docs/bench-history/2026-11.md, "Fewer
# crossings on the queued path").
jq -s --arg conc "$CONC" --argjson tok "$TPUT_TOKENS" "$JQ_DEFS"'
	def lbl: .run | capture("^(?<k>c[0-9]+|tput)-p(?<i>[0-9]+)-(?<l>.*)$");
	def per(s): if .result.done > 0 then (s * 1000 / .result.done | r3) else null end;
	def cpu(l): .cpu_seconds as $c | {
		api: per($c["api_" + l]),
		consumers: per(($c["consumer_" + l + "_1"] // 0) + ($c["consumer_" + l + "_2"] // 0)),
		redis: per($c.redis), simllm: per($c.simllm)};
	map(select(type == "object" and (.run // "" | test("^(c[0-9]+|tput)-p[0-9]+-")))) as $runs
	| ($runs | map(select(lbl.k != "tput")) ) as $p1
	| ($runs | map(select(lbl.k == "tput"))) as $p2
	| ($p1 | map(select(lbl.l == "direct")) | map({key: lbl.i, value: .result.latency.all.first_chunk}) | from_entries) as $direct
	| [$p1[] | lbl.l] + [$p2[] | lbl.l] | unique | map(select(. != "direct")) as $labels
	| {concurrency: ($conc | tonumber),
	   queued: ($labels | map(. as $l | {key: $l, value: (
		[$p1[] | select(lbl.l == $l) | {pair: (lbl.i | tonumber), done: .result.done, lost: .result.lost,
			p50: .result.latency.all.first_chunk.p50_ms, p99: .result.latency.all.first_chunk.p99_ms,
			added_p50: (.result.latency.all.first_chunk.p50_ms - $direct[lbl.i].p50_ms),
			added_p99: (.result.latency.all.first_chunk.p99_ms - $direct[lbl.i].p99_ms),
			streams_per_s: (.result.done / .result.elapsed_seconds), load: .load_before,
			cpu_ms_per_stream: cpu($l)}]
		| {runs: ., median: {added_p50: (map(.added_p50) | median | r3), added_p99: (map(.added_p99) | median | r3),
			api_ms: (map(.cpu_ms_per_stream.api) | median), consumers_ms: (map(.cpu_ms_per_stream.consumers) | median),
			redis_ms: (map(.cpu_ms_per_stream.redis) | median),
			over_simllm: (map(.cpu_ms_per_stream as $c | select($c.simllm > 0)
				| {api: ($c.api / $c.simllm), consumers: ($c.consumers / $c.simllm), redis: ($c.redis / $c.simllm)}) as $o
				| {api: ($o | map(.api) | median | r3), consumers: ($o | map(.consumers) | median | r3),
				   redis: ($o | map(.redis) | median | r3)})},
			lost: (map(.lost) | add)})}) | from_entries),
	   direct: ($p1 | map(select(lbl.l == "direct")) | map({pair: (lbl.i | tonumber), first_chunk: .result.latency.all.first_chunk,
		cpu_ms_per_stream: {api: per(.cpu_seconds.api_direct), redis: per(.cpu_seconds.redis), simllm: per(.cpu_seconds.simllm)}})),
	   throughput: ($labels | map(. as $l | {key: $l, value: (
		[$p2[] | select(lbl.l == $l) | {round: (lbl.i | tonumber), lost: .result.lost,
			chunks_per_s: ((.result.done * $tok / .result.elapsed_seconds) | round),
			cpu_us_per_chunk: (.cpu_seconds as $c | if .result.done > 0 then {
				api: (($c["api_" + $l] // 0) * 1e6 / (.result.done * $tok) | r3),
				consumers: ((($c["consumer_" + $l + "_1"] // 0) + ($c["consumer_" + $l + "_2"] // 0)) * 1e6 / (.result.done * $tok) | r3),
				redis: ($c.redis * 1e6 / (.result.done * $tok) | r3)} else null end), load: .load_before}]
		| {runs: ., median_chunks_per_s: (map(.chunks_per_s) | median)})}) | from_entries)}' \
	"$dir"/*.json >"$RESULTS/queuedcpu.json"

jq -r '(.queued | to_entries[] | "\(.key): added first chunk p50 \(.value.median.added_p50) ms p99 \(.value.median.added_p99) ms at c=\($ENV.CONC // "50"); CPU ms/stream api \(.value.median.api_ms) consumers \(.value.median.consumers_ms) redis \(.value.median.redis_ms), over simllm'"'"'s in the same run \(.value.median.over_simllm.api) / \(.value.median.over_simllm.consumers) / \(.value.median.over_simllm.redis); lost \(.value.lost)"),
	(.throughput | to_entries[] | "\(.key): relay \(.value.median_chunks_per_s) chunks/s (median of \(.value.runs | length))")' \
	"$RESULTS/queuedcpu.json" >&2
jq -e '([.queued[].lost] | add) == 0 and ([.throughput[].runs[].lost] | add // 0) == 0' "$RESULTS/queuedcpu.json" >/dev/null ||
	die "queuedcpu: streams lost (see $RESULTS/queuedcpu.json)"
