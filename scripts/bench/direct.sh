#!/usr/bin/env bash
# direct.sh: the api's added time to first chunk on the direct path.
#
# One simllm, one api in front of it (pool large enough that every request
# goes direct) with the default pool backend (Redis, shared with every
# process), and a second api with POOL_BACKEND=local, to tell the Redis
# pool's share of the cost. The load tool runs against simllm itself
# (-mode openai, path "upstream") and against each api (/v1/stream, path
# "direct"), interleaved upstream, api, api-local … for PAIRS rounds at each
# concurrency, so drift in machine load hits all alike. The added time is
# the median over rounds of (api − upstream) for p50 and p99 of time to
# first chunk.
#
# Writes $RESULTS/direct/*.json and $RESULTS/direct.json (summary).
#
# Environment: PAIRS (3), N1 (requests per run at concurrency 1, 100),
# N200 (at concurrency 200, 2000), SIM_FIRST_TOKEN_MS/SIM_TOKEN_MS/
# SIM_TOKENS (50/5/16).
source "$(dirname "$0")/lib.sh"
SCENARIO=direct
require_tools jq curl redis-server redis-cli ss

PAIRS=${PAIRS:-3}
N1=${N1:-100}
N200=${N200:-2000}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-5} TOK=${SIM_TOKENS:-16}

start_redis
start_simllm simllm "$FT" "$TI" "$TOK"
CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID)
start_api api CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000 DIRECT_PATH_ENABLED=true
API_PPROF=$PPROF_ADDR
CPU_PID[api]=$API_PID
API="http://127.0.0.1:$API_PORT/v1/stream"
start_api api-local CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000 DIRECT_PATH_ENABLED=true POOL_BACKEND=local
API_LOCAL="http://127.0.0.1:$API_PORT/v1/stream"
CPU_PID[api_local]=$API_PID

UP="http://127.0.0.1:$SIM_PORT/v1/chat/completions"
common=(-tokens "$TOK" -seed 1 -prompts 200 -timeout 60s)

log "warm-up"
run_load warmup-upstream 60 -mode openai -url "$UP" -c 200 -n 1000 "${common[@]}"
run_load warmup-api 60 -url "$API" -c 200 -n 1000 "${common[@]}"
run_load warmup-api-local 60 -url "$API_LOCAL" -c 200 -n 1000 "${common[@]}"

for c in 1 200; do
	n=$N1
	((c > 1)) && n=$N200
	for ((i = 1; i <= PAIRS; i++)); do
		run_load "c$c-p$i-upstream" 120 -mode openai -url "$UP" -c "$c" -n "$n" "${common[@]}"
		prof=
		if [[ -n $API_PPROF && $c -gt 1 && $i -eq 1 ]]; then
			save_profile "http://$API_PPROF/debug/pprof/profile?seconds=5" "$RESULTS/direct/api.c$c.cpu.pprof"
			prof=$REPLY
		fi
		run_load "c$c-p$i-api" 120 -url "$API" -c "$c" -n "$n" "${common[@]}"
		[[ -n $prof ]] && wait_pid "$prof"
		run_load "c$c-p$i-api-local" 120 -url "$API_LOCAL" -c "$c" -n "$n" "${common[@]}"
	done
done
[[ -n $API_PPROF ]] && curl -fsS -m 30 -o "$RESULTS/direct/api.heap.pprof" "http://$API_PPROF/debug/pprof/heap"

A_LABEL=upstream
{
	echo '{"scenario": "direct",'
	printf '"settings": {"pairs": %d, "n1": %d, "n200": %d, "sim_first_token_ms": %d, "sim_token_ms": %d, "sim_tokens": %d},\n' \
		"$PAIRS" "$N1" "$N200" "$FT" "$TI" "$TOK"
	for c in 1 200; do
		B_LABEL=api
		echo "\"c$c\":"
		pair_summary "$RESULTS"/direct/c$c-p*.json
		B_LABEL=api-local
		echo ", \"c${c}_local_pool\":"
		pair_summary "$RESULTS"/direct/c$c-p*.json
		((c == 1)) && echo ","
	done
	echo '}'
} | jq . >"$RESULTS/direct.json"

jq -r '"direct: added first chunk c=1 p50 \(.c1.median.added_p50)ms p99 \(.c1.median.added_p99)ms; c=200 p50 \(.c200.median.added_p50)ms p99 \(.c200.median.added_p99)ms; local pool c=200 p50 \(.c200_local_pool.median.added_p50)ms p99 \(.c200_local_pool.median.added_p99)ms; lost \(.c1.lost + .c200.lost + .c1_local_pool.lost + .c200_local_pool.lost)"' \
	"$RESULTS/direct.json" >&2
# Every api run must have gone direct, and nothing may be lost.
jq -e '[.c1, .c200, .c1_local_pool, .c200_local_pool] | all(.lost == 0 and all(.pairs[]; (.b.paths | keys) == ["direct"]))' "$RESULTS/direct.json" >/dev/null ||
	die "direct: streams lost or not on the direct path (see $RESULTS/direct.json)"
