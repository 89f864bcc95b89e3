#!/usr/bin/env bash
# flood.sh: far more demand than capacity, nothing may be lost.
#
# One simllm; one api with CONNECTION_POOL_SIZE=FLOOD_POOL (16); 2
# consumers with the same pool size and WORKER_CONCURRENCY=16. The load
# tool sends FLOOD_N (5000) requests, FLOOD_C (500) at a time, every prompt
# distinct, spread over FLOOD_USERS (50) X-User-ID identities (so the
# per-user limit of 5 is not what binds), verifying every answer. Most
# requests spill to the queue. Reports outcomes, p50/p99 of first chunk and
# total time per path, and CPU seconds per process.
#
# Each process has its own local pool (the api's and each consumer's), so
# at most 3 × FLOOD_POOL streams run upstream at once.
#
# Writes $RESULTS/flood/flood.json and $RESULTS/flood.json.
source "$(dirname "$0")/lib.sh"
SCENARIO=flood
require_tools jq curl redis-server redis-cli ss

FLOOD_N=${FLOOD_N:-5000}
FLOOD_C=${FLOOD_C:-500}
FLOOD_POOL=${FLOOD_POOL:-16}
FLOOD_USERS=${FLOOD_USERS:-50}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-5} TOK=${SIM_TOKENS:-16}

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
start_redis
start_simllm simllm "$FT" "$TI" "$TOK"
CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID)
CONSUMER_METRICS=()
start_api api CONNECTION_POOL_SIZE="$FLOOD_POOL"
CPU_PID[api]=$API_PID
API_PPROF=$PPROF_ADDR
for i in 1 2; do
	start_consumer "consumer-$i" CONNECTION_POOL_SIZE="$FLOOD_POOL" WORKER_CONCURRENCY=16
	CPU_PID[consumer_$i]=$CONSUMER_PID
	CONSUMER_METRICS+=("http://127.0.0.1:$CONSUMER_PORT/metrics")
	[[ $i == 1 ]] && CONSUMER_PPROF=$PPROF_ADDR
done

load_start flood 300 -url "http://127.0.0.1:$API_PORT/v1/stream" -c "$FLOOD_C" -n "$FLOOD_N" \
	-prompts "$FLOOD_N" -users "$FLOOD_USERS" -tokens "$TOK" -seed 1 -timeout 120s
LT=$REPLY
profs=()
if [[ -n $API_PPROF ]]; then
	save_profile "http://$API_PPROF/debug/pprof/profile?seconds=8" "$RESULTS/flood/api.cpu.pprof"
	profs+=("$REPLY")
	save_profile "http://$CONSUMER_PPROF/debug/pprof/profile?seconds=8" "$RESULTS/flood/consumer-1.cpu.pprof"
	profs+=("$REPLY")
fi
# The queue backlog (spillway_queue_depth, read from Redis at each scrape),
# sampled while the flood runs.
peak_depth=0
while kill -0 "$LT" 2>/dev/null; do
	d=$(metric "http://127.0.0.1:$API_PORT/metrics" spillway_queue_depth)
	d=${d%.*}
	((d > peak_depth)) && peak_depth=$d
	sleep 0.5
done
load_finish flood
# Which Redis commands the flood cost (calls, µs), to see what bounds it.
redis-cli -p "$REDIS_PORT" info commandstats >"$RESULTS/flood/redis-commandstats.txt" 2>/dev/null || true
for p in "${profs[@]}"; do wait_pid "$p"; done
[[ -n $API_PPROF ]] && curl -fsS -m 30 -o "$RESULTS/flood/api.heap.pprof" "http://$API_PPROF/debug/pprof/heap"
# Mean wait of a job in the queue, from the consumers' histograms.
wait_mean=$(for u in "${CONSUMER_METRICS[@]}"; do curl -fsS -m 5 "$u"; done |
	awk '/^spillway_queue_wait_seconds_(sum|count) / {v[$1] += $2} END {if (v["spillway_queue_wait_seconds_count"] > 0) printf "%.1f", 1000 * v["spillway_queue_wait_seconds_sum"] / v["spillway_queue_wait_seconds_count"]; else print "null"}')

jq --argjson pool "$FLOOD_POOL" --argjson users "$FLOOD_USERS" \
	--argjson depth "$peak_depth" --argjson tok "$TOK" --argjson wait "$wait_mean" \
	--argjson ft "$FT" --argjson ti "$TI" '{
	scenario: "flood",
	settings: {requests: (.args | capture("-n (?<n>[0-9]+)").n | tonumber), concurrency: (.args | capture("-c (?<c>[0-9]+)").c | tonumber),
		pool: $pool, consumers: 2, worker_concurrency: 16, users: $users,
		sim_first_token_ms: $ft, sim_token_ms: $ti, sim_tokens: $tok},
	outcome: {requests: .result.requests, done: .result.done, errors: .result.errors, errors_by_type: .result.errors_by_type,
		refused: .result.refused, refused_by: .result.refused_by, lost: .result.lost, lost_by_reason: .result.lost_by_reason,
		lost_samples: .result.lost_samples, resets: .result.resets, exit_code: .exit_code},
	paths: .result.paths, latency_ms: .result.latency,
	elapsed_s: .result.elapsed_seconds, streams_per_s: ((.result.done / .result.elapsed_seconds) * 10 | round / 10),
	chunks_per_s: ((.result.done * $tok / .result.elapsed_seconds) | round),
	queue_depth_peak: $depth, queue_wait_mean_ms: $wait,
	cpu_seconds,
	load_before, load_after}' "$RESULTS/flood/flood.json" >"$RESULTS/flood.json"

jq -r '"flood: \(.outcome.done) done, \(.outcome.errors) errors, \(.outcome.refused) refused, \(.outcome.lost) lost; paths \(.paths | tojson); first chunk p99 \(.latency_ms | with_entries(.value |= .first_chunk.p99_ms) | tojson)"' \
	"$RESULTS/flood.json" >&2
jq -e '.outcome.lost == 0' "$RESULTS/flood.json" >/dev/null || die "flood: streams were lost (see $RESULTS/flood.json)"
