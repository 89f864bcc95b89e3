#!/usr/bin/env bash
# queued.sh: the queue path's added time to first chunk, and relay
# throughput.
#
# Part 1, overhead: one simllm; an api that streams direct (pool large
# enough for every request); an api with DIRECT_PATH_ENABLED=false whose
# jobs go to 2 idle consumers with the default chunk batching (5 chunks or
# 100ms); and the same with QUEUE_FAILOVER_CHUNK_BATCH_SIZE=1, so the cost
# of the queue itself and the wait for a full batch can be told apart.
# Consumers have WORKER_CONCURRENCY=128 each, so at 200 concurrent no job
# waits for a worker. Runs are interleaved direct, queued, queued-b1 for
# PAIRS rounds at concurrency 1 and 200; the added time is the median over
# rounds of (queued − direct) p50 and p99 of time to first chunk.
#
# Part 2, relay throughput: simllm without pacing (SIM_FIRST_TOKEN_MS=0,
# SIM_TOKEN_MS=0, TPUT_TOKENS chunks per answer), the load tool at
# TPUT_C concurrent against the upstream, the direct api and the queued api
# once each; chunks/s delivered to clients and CPU seconds per process.
#
# Writes $RESULTS/queued/*.json and $RESULTS/queued.json (summary).
# Environment: PAIRS (3), CONCS ("1 50 200"), N1 (100), NC (requests per
# run above concurrency 1, 2000), SIM_* (50/5/16),
# TPUT_C (64), TPUT_N (1500), TPUT_TOKENS (64), TPUT_BATCH (20: the chunk
# batch of the second queued api's consumers in part 2).
source "$(dirname "$0")/lib.sh"
SCENARIO=queued
require_tools jq curl redis-server redis-cli ss

PAIRS=${PAIRS:-3}
CONCS=${CONCS:-1 50 200}
N1=${N1:-100}
NC=${NC:-${N200:-2000}}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-5} TOK=${SIM_TOKENS:-16}
TPUT_C=${TPUT_C:-64} TPUT_N=${TPUT_N:-1500} TPUT_TOKENS=${TPUT_TOKENS:-64} TPUT_BATCH=${TPUT_BATCH:-20}

worker_env=(CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000 WORKER_CONCURRENCY=128)

# --- part 1: overhead ---
start_redis
start_simllm simllm "$FT" "$TI" "$TOK"
CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID)
start_api api-direct CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000
DIRECT="http://127.0.0.1:$API_PORT/v1/stream"
CPU_PID[api_direct]=$API_PID
# The load tool is one identity: at 200 concurrent it would pass the
# per-identity queue cap (QUEUE_MAX_PER_IDENTITY, 100) and be refused.
start_api api-queued DIRECT_PATH_ENABLED=false QUEUE_MAX_PER_IDENTITY=1000 QUEUE_PREFIX=qb5:
QUEUED="http://127.0.0.1:$API_PORT/v1/stream"
QUEUED_PPROF=$PPROF_ADDR
CPU_PID[api_queued]=$API_PID
for i in 1 2; do
	start_consumer "consumer-b5-$i" QUEUE_PREFIX=qb5: "${worker_env[@]}"
	CPU_PID[consumer_b5_$i]=$CONSUMER_PID
done
start_api api-queued-b1 DIRECT_PATH_ENABLED=false QUEUE_MAX_PER_IDENTITY=1000 QUEUE_PREFIX=qb1:
QUEUED_B1="http://127.0.0.1:$API_PORT/v1/stream"
CPU_PID[api_queued_b1]=$API_PID
for i in 1 2; do
	start_consumer "consumer-b1-$i" QUEUE_PREFIX=qb1: QUEUE_FAILOVER_CHUNK_BATCH_SIZE=1 "${worker_env[@]}"
	CPU_PID[consumer_b1_$i]=$CONSUMER_PID
done

common=(-tokens "$TOK" -seed 1 -prompts 200 -timeout 60s)
log "warm-up"
run_load warmup-direct 60 -url "$DIRECT" -c 200 -n 1000 "${common[@]}"
run_load warmup-queued 60 -url "$QUEUED" -c 200 -n 1000 "${common[@]}"
run_load warmup-queued-b1 60 -url "$QUEUED_B1" -c 200 -n 1000 "${common[@]}"

for c in $CONCS; do
	n=$N1
	((c > 1)) && n=$NC
	for ((i = 1; i <= PAIRS; i++)); do
		run_load "c$c-p$i-direct" 120 -url "$DIRECT" -c "$c" -n "$n" "${common[@]}"
		prof=
		if [[ -n $QUEUED_PPROF && $c -gt 1 && $i -eq 1 ]]; then
			save_profile "http://$QUEUED_PPROF/debug/pprof/profile?seconds=5" "$RESULTS/queued/api-queued.c$c.cpu.pprof"
			prof=$REPLY
		fi
		run_load "c$c-p$i-queued" 120 -url "$QUEUED" -c "$c" -n "$n" "${common[@]}"
		[[ -n $prof ]] && wait_pid "$prof"
		run_load "c$c-p$i-queued-b1" 120 -url "$QUEUED_B1" -c "$c" -n "$n" "${common[@]}"
	done
done
stop_all

# --- part 2: relay throughput ---
start_redis
start_simllm simllm-fast 0 0 "$TPUT_TOKENS"
start_api api-direct-fast CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000
DIRECT="http://127.0.0.1:$API_PORT/v1/stream"
CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID [api_direct]=$API_PID)
start_api api-queued-fast DIRECT_PATH_ENABLED=false QUEUE_MAX_PER_IDENTITY=1000
QUEUED="http://127.0.0.1:$API_PORT/v1/stream"
CPU_PID[api_queued]=$API_PID
start_consumer consumer-fast-1 "${worker_env[@]}"
CPU_PID[consumer_1]=$CONSUMER_PID
start_consumer consumer-fast-2 "${worker_env[@]}"
CPU_PID[consumer_2]=$CONSUMER_PID
# The same with larger batches (TPUT_BATCH chunks a message).
start_api api-queued-big DIRECT_PATH_ENABLED=false QUEUE_MAX_PER_IDENTITY=1000 QUEUE_PREFIX=qbig:
QUEUED_BIG="http://127.0.0.1:$API_PORT/v1/stream"
CPU_PID[api_queued_big]=$API_PID
for i in 1 2; do
	start_consumer "consumer-big-$i" QUEUE_PREFIX=qbig: QUEUE_FAILOVER_CHUNK_BATCH_SIZE="$TPUT_BATCH" "${worker_env[@]}"
	CPU_PID[consumer_big_$i]=$CONSUMER_PID
done
UP="http://127.0.0.1:$SIM_PORT/v1/chat/completions"
tcommon=(-tokens "$TPUT_TOKENS" -seed 1 -prompts 200 -timeout 60s -c "$TPUT_C")

run_load tput-warmup 60 -url "$QUEUED" -n 300 "${tcommon[@]}"
run_load tput-warmup-big 60 -url "$QUEUED_BIG" -n 300 "${tcommon[@]}"
for target in upstream direct queued queued-big; do
	case $target in
	upstream) args=(-mode openai -url "$UP") ;;
	direct) args=(-url "$DIRECT") ;;
	queued) args=(-url "$QUEUED") ;;
	queued-big) args=(-url "$QUEUED_BIG") ;;
	esac
	run_load "tput-$target" 180 "${args[@]}" -n "$TPUT_N" "${tcommon[@]}"
done

# --- summary ---
A_LABEL=direct
{
	echo '{"scenario": "queued",'
	printf '"settings": {"pairs": %d, "n1": %d, "n": %d, "sim_first_token_ms": %d, "sim_token_ms": %d, "sim_tokens": %d, "tput_c": %d, "tput_n": %d, "tput_tokens": %d, "tput_batch": %d},\n' \
		"$PAIRS" "$N1" "$NC" "$FT" "$TI" "$TOK" "$TPUT_C" "$TPUT_N" "$TPUT_TOKENS" "$TPUT_BATCH"
	for c in $CONCS; do
		B_LABEL=queued
		echo "\"c$c\":"
		pair_summary "$RESULTS"/queued/c$c-p*.json
		B_LABEL=queued-b1
		echo ", \"c${c}_b1\":"
		pair_summary "$RESULTS"/queued/c$c-p*.json
		echo ","
	done
	echo '"throughput":'
	jq -s --argjson tok "$TPUT_TOKENS" 'map({key: (.run | ltrimstr("tput-")), value: {
		done: .result.done, lost: .result.lost, elapsed_s: .result.elapsed_seconds,
		streams_per_s: ((.result.done / .result.elapsed_seconds) * 10 | round / 10),
		chunks_per_s: ((.result.done * $tok / .result.elapsed_seconds) | round),
		first_chunk: .result.latency.all.first_chunk, total: .result.latency.all.total,
		cpu_seconds, load: .load_before}}) | from_entries' \
		"$RESULTS"/queued/tput-upstream.json "$RESULTS"/queued/tput-direct.json "$RESULTS"/queued/tput-queued.json \
		"$RESULTS"/queued/tput-queued-big.json
	echo '}'
} | jq . >"$RESULTS/queued.json"

jq -r '(to_entries[] | select(.key | test("^c[0-9]+$")) | "queued c=\(.key | ltrimstr("c")): added first chunk (batch 5) p50 \(.value.median.added_p50)ms p99 \(.value.median.added_p99)ms"),
	(to_entries[] | select(.key | test("^c[0-9]+_b1$")) | "queued c=\(.key | ltrimstr("c") | rtrimstr("_b1")), batch 1: added p50 \(.value.median.added_p50)ms p99 \(.value.median.added_p99)ms"),
	"relay \(.throughput.queued.chunks_per_s) chunks/s queued (batch 5), \(.throughput["queued-big"].chunks_per_s) (batch \(.settings.tput_batch)), \(.throughput.direct.chunks_per_s) direct, \(.throughput.upstream.chunks_per_s) upstream alone"' \
	"$RESULTS/queued.json" >&2
jq -e '([to_entries[] | select(.key | test("^c[0-9]+(_b1)?$")) | .value] | all(.lost == 0 and all(.pairs[]; (.b.paths | keys) == ["queued"])))
	and ([.throughput[].lost] | add) == 0' "$RESULTS/queued.json" >/dev/null ||
	die "queued: streams lost or not on the queued path (see $RESULTS/queued.json)"
