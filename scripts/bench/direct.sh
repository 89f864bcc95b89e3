#!/usr/bin/env bash
# direct.sh: the api's cost on the direct path, beside the floor of one
# bare pass-through hop measured in the same run.
#
# Part 1, latency: one paced simllm; in front of it a bare pass-through
# proxy (passproxy, httputil.ReverseProxy: "the floor"), an api with the
# default pool backend (Redis, shared with every process) and pool large
# enough that every request goes direct, and a second api with
# POOL_BACKEND=local, to tell the Redis pool's share. The load tool runs
# against simllm itself (-mode openai, "upstream"), the proxy (-mode
# openai), and each api (/v1/stream), interleaved for PAIRS rounds at each
# concurrency in CONCS, so drift in machine load hits all alike. Added =
# median over rounds of (target − upstream) of the run's p50 and p99 time
# to first chunk; the ratio api / proxy of the added p50 says how far the
# api is from one extra hop.
#
# Part 2, throughput and CPU: an unpaced simllm (TPUT_TOKENS chunks per
# answer), the same proxy and api in front of it, TPUT_C concurrent
# clients, TPUT_N streams per run, interleaved for PAIRS rounds, with full
# answers and with answers cut to TPUT_SHORT chunks (-max-tokens): streams/s
# of api and proxy, and the api's CPU split into a cost per stream and per
# chunk from the two answer lengths.
#
# Writes $RESULTS/direct/*.json and $RESULTS/direct.json (summary). With
# BENCH_PROFILE=1 also a 5 s CPU profile of the api in the first round at
# every concurrency above 1 (direct/api.c<N>.cpu.pprof).
#
# BASELINE_BIN, when set, is a directory with another build's api (the
# commit before a change): it runs beside the api as target "api-base" in
# both parts, so before and after are measured in the same run, and is
# profiled too (direct/api-base.c<N>.cpu.pprof).
#
# Environment: PAIRS (3), CONCS ("1 50 200"), N1 (requests per run at
# concurrency 1, 100), NC (at higher concurrency, 2000),
# SIM_FIRST_TOKEN_MS/SIM_TOKEN_MS/SIM_TOKENS (50/5/16), TPUT_C (64),
# TPUT_N (3000), TPUT_TOKENS (50), TPUT_SHORT (5).
source "$(dirname "$0")/lib.sh"
SCENARIO=direct
require_tools jq curl redis-server redis-cli ss

PAIRS=${PAIRS:-3}
CONCS=${CONCS:-1 50 200}
N1=${N1:-100}
NC=${NC:-${N200:-2000}}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-5} TOK=${SIM_TOKENS:-16}
TPUT_C=${TPUT_C:-64} TPUT_N=${TPUT_N:-3000} TPUT_TOKENS=${TPUT_TOKENS:-50} TPUT_SHORT=${TPUT_SHORT:-5}

# Every api: a pool large enough for every request (its local fallback
# too, should Redis be judged gone mid-run), and no queue: a request the
# pool refused (full, or Redis too slow to answer in time: issue 19's
# rule) would queue, and with nothing serving the queue every later one
# would queue behind it. Refused, it is counted and fails the check.
DIRECT_ENV=(CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000 POOL_LOCAL_FALLBACK_SIZE=1000 DIRECT_PATH_ENABLED=true QUEUE_FAILOVER_ENABLED=false)

# --- part 1: latency ---
start_redis
start_simllm simllm "$FT" "$TI" "$TOK"
CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID)
start_proxy proxy "http://127.0.0.1:$SIM_PORT"
CPU_PID[proxy]=$PROXY_PID
PROXY="http://127.0.0.1:$PROXY_PORT/v1/chat/completions"
start_api api "${DIRECT_ENV[@]}"
API_PPROF=$PPROF_ADDR
CPU_PID[api]=$API_PID
API="http://127.0.0.1:$API_PORT/v1/stream"
start_api api-local "${DIRECT_ENV[@]}" POOL_BACKEND=local
API_LOCAL="http://127.0.0.1:$API_PORT/v1/stream"
CPU_PID[api_local]=$API_PID
TARGETS=(api api-local proxy)
if [[ -n ${BASELINE_BIN:-} ]]; then
	API_BIN=$BASELINE_BIN/api start_api api-base "${DIRECT_ENV[@]}"
	API_BASE="http://127.0.0.1:$API_PORT/v1/stream"
	BASE_PPROF=$PPROF_ADDR
	CPU_PID[api_base]=$API_PID
	TARGETS+=(api-base)
fi

UP="http://127.0.0.1:$SIM_PORT/v1/chat/completions"
common=(-tokens "$TOK" -seed 1 -prompts 200 -timeout 60s)

log "warm-up"
run_load warmup-upstream 60 -mode openai -url "$UP" -c 200 -n 1000 "${common[@]}"
run_load warmup-proxy 60 -mode openai -url "$PROXY" -c 200 -n 1000 "${common[@]}"
run_load warmup-api 60 -url "$API" -c 200 -n 1000 "${common[@]}"
run_load warmup-api-local 60 -url "$API_LOCAL" -c 200 -n 1000 "${common[@]}"
[[ -n ${API_BASE:-} ]] && run_load warmup-api-base 60 -url "$API_BASE" -c 200 -n 1000 "${common[@]}"

for c in $CONCS; do
	n=$N1
	((c > 1)) && n=$NC
	for ((i = 1; i <= PAIRS; i++)); do
		run_load "c$c-p$i-upstream" 120 -mode openai -url "$UP" -c "$c" -n "$n" "${common[@]}"
		run_load "c$c-p$i-proxy" 120 -mode openai -url "$PROXY" -c "$c" -n "$n" "${common[@]}"
		prof=
		if [[ -n $API_PPROF && $c -gt 1 && $i -eq 1 ]]; then
			save_profile "http://$API_PPROF/debug/pprof/profile?seconds=5" "$RESULTS/direct/api.c$c.cpu.pprof"
			prof=$REPLY
		fi
		run_load "c$c-p$i-api" 120 -url "$API" -c "$c" -n "$n" "${common[@]}"
		[[ -n $prof ]] && wait_pid "$prof"
		run_load "c$c-p$i-api-local" 120 -url "$API_LOCAL" -c "$c" -n "$n" "${common[@]}"
		if [[ -n ${API_BASE:-} ]]; then
			prof=
			if [[ -n $BASE_PPROF && $c -gt 1 && $i -eq 1 ]]; then
				save_profile "http://$BASE_PPROF/debug/pprof/profile?seconds=5" "$RESULTS/direct/api-base.c$c.cpu.pprof"
				prof=$REPLY
			fi
			run_load "c$c-p$i-api-base" 120 -url "$API_BASE" -c "$c" -n "$n" "${common[@]}"
			[[ -n $prof ]] && wait_pid "$prof"
		fi
	done
done
[[ -n $API_PPROF ]] && curl -fsS -m 30 -o "$RESULTS/direct/api.heap.pprof" "http://$API_PPROF/debug/pprof/heap"
stop_all

# --- part 2: throughput and CPU per stream and per chunk ---
start_redis
start_simllm simllm-fast 0 0 "$TPUT_TOKENS"
CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID)
start_proxy proxy-fast "http://127.0.0.1:$SIM_PORT"
CPU_PID[proxy]=$PROXY_PID
PROXY="http://127.0.0.1:$PROXY_PORT/v1/chat/completions"
start_api api-fast "${DIRECT_ENV[@]}"
CPU_PID[api]=$API_PID
API="http://127.0.0.1:$API_PORT/v1/stream"
TTARGETS=(api proxy)
if [[ -n ${BASELINE_BIN:-} ]]; then
	API_BIN=$BASELINE_BIN/api start_api api-base-fast "${DIRECT_ENV[@]}"
	API_BASE="http://127.0.0.1:$API_PORT/v1/stream"
	CPU_PID[api_base]=$API_PID
	TTARGETS+=(api-base)
fi
UP="http://127.0.0.1:$SIM_PORT/v1/chat/completions"
tcommon=(-tokens "$TPUT_TOKENS" -seed 1 -prompts 200 -timeout 60s -c "$TPUT_C" -n "$TPUT_N")
run_load tput-warmup-api 60 -url "$API" -n 1000 "${tcommon[@]}"
run_load tput-warmup-proxy 60 -mode openai -url "$PROXY" -n 1000 "${tcommon[@]}"
for len in long short; do
	mt=()
	[[ $len == short ]] && mt=(-max-tokens "$TPUT_SHORT")
	for ((i = 1; i <= PAIRS; i++)); do
		run_load "t$len-p$i-upstream" 180 -mode openai -url "$UP" "${tcommon[@]}" "${mt[@]}"
		run_load "t$len-p$i-proxy" 180 -mode openai -url "$PROXY" "${tcommon[@]}" "${mt[@]}"
		run_load "t$len-p$i-api" 180 -url "$API" "${tcommon[@]}" "${mt[@]}"
		[[ -n ${API_BASE:-} ]] && run_load "t$len-p$i-api-base" 180 -url "$API_BASE" "${tcommon[@]}" "${mt[@]}"
	done
done

# --- summary ---
A_LABEL=upstream
{
	echo '{"scenario": "direct",'
	printf '"settings": {"pairs": %d, "concurrency": %s, "n1": %d, "n": %d, "sim_first_token_ms": %d, "sim_token_ms": %d, "sim_tokens": %d, "tput_c": %d, "tput_n": %d, "tput_tokens": %d, "tput_short": %d},\n' \
		"$PAIRS" "$(jq -cn --arg c "$CONCS" '$c | split(" ") | map(select(. != "") | tonumber)')" "$N1" "$NC" "$FT" "$TI" "$TOK" \
		"$TPUT_C" "$TPUT_N" "$TPUT_TOKENS" "$TPUT_SHORT"
	for c in $CONCS; do
		echo "\"c$c\": {"
		sep=
		for B_LABEL in "${TARGETS[@]}"; do
			echo "$sep\"${B_LABEL//-/_}\":"
			pair_summary "$RESULTS"/direct/c$c-p*.json
			sep=,
		done
		echo "},"
	done
	for len in long short; do
		echo "\"t$len\": {"
		sep=
		for B_LABEL in "${TTARGETS[@]}"; do
			echo "$sep\"${B_LABEL//-/_}\":"
			pair_summary "$RESULTS"/direct/t$len-p*.json
			sep=,
		done
		echo "},"
	done
	echo '"end": null}'
} | jq --argjson long "$TPUT_TOKENS" --argjson short "$TPUT_SHORT" "$JQ_DEFS"'
	del(.end)
	# The floor: the proxy beside the api, as ratios (api / proxy).
	| (to_entries | map(select(.key | test("^c[0-9]+$"))) | map(.value |= {
		api_added_p50: .api.median.added_p50, api_added_p99: .api.median.added_p99,
		proxy_added_p50: .proxy.median.added_p50, proxy_added_p99: .proxy.median.added_p99,
		baseline_added_p50: .api_base.median.added_p50, baseline_added_p99: .api_base.median.added_p99,
		ratio_p50: (if (.proxy.median.added_p50 // 0) > 0 then .api.median.added_p50 / .proxy.median.added_p50 | r3 else null end),
		ratio_p99: (if (.proxy.median.added_p99 // 0) > 0 then .api.median.added_p99 / .proxy.median.added_p99 | r3 else null end)})
	  | from_entries) as $lat
	# CPU of one process per stream in a throughput run (µs), median over rounds.
	| def cpu(proc): [.pairs[].b | .cpu_seconds[proc] * 1e6 / .done] | median;
	def cpua(proc): [.pairs[].a | .cpu_seconds[proc] * 1e6 / .done] | median;
	def opt(f): if . == null then null else f end;
	{long: {api_us: (.tlong.api | cpu("api")), proxy_us: (.tlong.proxy | cpu("proxy")),
	        simllm_us: (.tlong.api | cpua("simllm")), redis_us: (.tlong.api | cpu("redis")),
	        baseline_us: (.tlong.api_base | opt(cpu("api_base")))},
	 short: {api_us: (.tshort.api | cpu("api")), proxy_us: (.tshort.proxy | cpu("proxy")),
	        baseline_us: (.tshort.api_base | opt(cpu("api_base")))}} as $cpu
	| ((($cpu.long.api_us - $cpu.short.api_us) / ($long - $short))) as $api_chunk
	| ((($cpu.long.proxy_us - $cpu.short.proxy_us) / ($long - $short))) as $proxy_chunk
	| ($cpu.long.baseline_us | opt(((. - $cpu.short.baseline_us) / ($long - $short)))) as $base_chunk
	| . + {floor: $lat,
	       throughput: {
		streams_per_s: {upstream: .tlong.api.median.a_streams_per_s, proxy: .tlong.proxy.median.b_streams_per_s, api: .tlong.api.median.b_streams_per_s,
			baseline: .tlong.api_base.median.b_streams_per_s},
		chunks_per_s: {upstream: (.tlong.api.median.a_streams_per_s * $long | round), proxy: (.tlong.proxy.median.b_streams_per_s * $long | round),
			api: (.tlong.api.median.b_streams_per_s * $long | round)},
		proxy_over_api: (.tlong.proxy.median.b_streams_per_s / .tlong.api.median.b_streams_per_s | r3),
		short_streams_per_s: {proxy: .tshort.proxy.median.b_streams_per_s, api: .tshort.api.median.b_streams_per_s},
		cpu_us_per_stream: $cpu,
		api_cpu_us_per_chunk: ($api_chunk | r3), api_cpu_us_per_stream_fixed: (($cpu.short.api_us - $short * $api_chunk) | r3),
		proxy_cpu_us_per_chunk: ($proxy_chunk | r3), proxy_cpu_us_per_stream_fixed: (($cpu.short.proxy_us - $short * $proxy_chunk) | r3),
		baseline_cpu_us_per_chunk: ($base_chunk | opt(r3)),
		baseline_cpu_us_per_stream_fixed: ($base_chunk | opt(($cpu.short.baseline_us - $short * .) | r3))},
	       lost: ([.[] | objects | .[]? | objects | .lost? // empty] | add)}' >"$RESULTS/direct.json"

jq -r '(.floor | to_entries[] | "direct c=\(.key | ltrimstr("c")): added first chunk p50 \(.value.api_added_p50)ms p99 \(.value.api_added_p99)ms; the floor (pass-through proxy) p50 \(.value.proxy_added_p50)ms p99 \(.value.proxy_added_p99)ms; ratio api/proxy p50 \(.value.ratio_p50) p99 \(.value.ratio_p99)"),
	"direct throughput (\(.settings.tput_tokens) chunks, c=\(.settings.tput_c)): api \(.throughput.streams_per_s.api) streams/s, proxy \(.throughput.streams_per_s.proxy), upstream alone \(.throughput.streams_per_s.upstream); proxy/api \(.throughput.proxy_over_api)",
	(if .throughput.streams_per_s.baseline then "direct baseline build: \(.floor | to_entries | map("c=\(.key | ltrimstr("c")) added p50 \(.value.baseline_added_p50)ms p99 \(.value.baseline_added_p99)ms") | join("; ")); \(.throughput.streams_per_s.baseline) streams/s; \(.throughput.baseline_cpu_us_per_chunk) µs per chunk + \(.throughput.baseline_cpu_us_per_stream_fixed) µs per stream" else empty end),
	"direct CPU: api \(.throughput.api_cpu_us_per_chunk) µs per chunk + \(.throughput.api_cpu_us_per_stream_fixed) µs per stream; proxy \(.throughput.proxy_cpu_us_per_chunk) µs per chunk + \(.throughput.proxy_cpu_us_per_stream_fixed) µs per stream; lost \(.lost)"' \
	"$RESULTS/direct.json" >&2
# Every api run must have gone direct, and nothing may be lost.
jq -e '.lost == 0 and ([.[] | objects | .api?, .api_local?, .api_base? | objects | .pairs[].b.paths | keys] | all(. == ["direct"]))' "$RESULTS/direct.json" >/dev/null ||
	die "direct: streams lost or not on the direct path (see $RESULTS/direct.json)"
