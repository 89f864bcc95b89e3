#!/usr/bin/env bash
# aged.sh: does an api that has served minutes of load stream more slowly
# than a fresh one? A companion of soak.sh for telling decay from machine
# noise (docs/BENCHMARKS.md, "Soak"): on a shared machine streams/s drifts
# with everyone else's load, so the aged process is compared with fresh
# ones in interleaved rounds, which drift hits alike.
#
# One simllm (SOAK_TOKENS (50) chunks, no pause). Redis 1 with api "aged"
# and a consumer; api "aged" first serves AGE_MINUTES (5) of the soak's
# direct load (SOAK_C (200) clients over 200 identities). Then api
# "fresh-api" starts on the same Redis 1 (so Redis is as aged as for the
# aged api), and api "fresh-all" on a new Redis 2 with its own consumer.
# ROUNDS (3) rounds of ROUND_SECONDS (30) each against aged, fresh-api,
# fresh-all in turn. Per arm: median streams/s, first-chunk p50/p99, api
# CPU µs per stream, Redis CPU µs per stream.
#
#   aged ≈ fresh-api ≈ fresh-all  the drift was the machine's
#   aged < fresh-api ≈ fresh-all  the api process ages
#   aged ≈ fresh-api < fresh-all  Redis's state ages (e.g. stream logs)
#
# Writes $RESULTS/aged/*.json and $RESULTS/aged.json; exits 1 when a stream
# is lost.
source "$(dirname "$0")/lib.sh"
SCENARIO=aged
require_tools go jq curl redis-server redis-cli ss timeout

AGE_MINUTES=${AGE_MINUTES:-5}
ROUNDS=${ROUNDS:-3}
ROUND_SECONDS=${ROUND_SECONDS:-30}
SOAK_C=${SOAK_C:-200}
SOAK_TOKENS=${SOAK_TOKENS:-50}
for v in AGE_MINUTES ROUNDS ROUND_SECONDS SOAK_C SOAK_TOKENS; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v=${!v}: want a positive whole number"
done

if [[ ${SOAK_SKIP_BUILD:-0} != 1 ]]; then
	log "building into $BIN"
	(cd "$ROOT" && go build -o "$BIN/" ./cmd/...)
fi
machine_json >"$RESULTS/machine.json"
dir="$RESULTS/$SCENARIO"
mkdir -p "$dir"

pool_env=(CONNECTION_POOL_SIZE=100000 CONNECTION_POOL_PER_USER=5 RATE_LIMIT_RPS=0)
common=(-c "$SOAK_C" -n 0 -tokens "$SOAK_TOKENS" -seed 1 -prompts 200 -timeout 60s -verify -users 200)

start_simllm simllm 0 0 "$SOAK_TOKENS"
start_redis
R1_PID=$REDIS_PID
start_api api-aged "${pool_env[@]}"
declare -A URL API REDIS
URL[aged]="http://127.0.0.1:$API_PORT/v1/stream" API[aged]=$API_PID REDIS[aged]=$R1_PID
start_consumer consumer-1 "${pool_env[@]}" WORKER_CONCURRENCY=128

for ((i = 1; i <= AGE_MINUTES; i++)); do
	run_load "age-$i" 120 -url "${URL[aged]}" "${common[@]}" -d 60s
done

start_api api-fresh-api "${pool_env[@]}"
URL[fresh-api]="http://127.0.0.1:$API_PORT/v1/stream" API[fresh-api]=$API_PID REDIS[fresh-api]=$R1_PID
start_redis
start_api api-fresh-all "${pool_env[@]}"
URL[fresh-all]="http://127.0.0.1:$API_PORT/v1/stream" API[fresh-all]=$API_PID REDIS[fresh-all]=$REDIS_PID
start_consumer consumer-2 "${pool_env[@]}" WORKER_CONCURRENCY=128

arms=(aged fresh-api fresh-all)
for ((r = 1; r <= ROUNDS; r++)); do
	for a in "${arms[@]}"; do
		CPU_PID=([api]=${API[$a]} [redis]=${REDIS[$a]})
		run_load "r$r-$a" $((ROUND_SECONDS + 60)) -url "${URL[$a]}" "${common[@]}" -d "${ROUND_SECONDS}s"
	done
done

jq -s --argjson rounds "$ROUNDS" --argjson rs "$ROUND_SECONDS" --argjson age "$AGE_MINUTES" "$JQ_DEFS"'
	map(select(.run | test("^r[0-9]+-"))
	    | {arm: (.run | sub("^r[0-9]+-"; "")), round: (.run | capture("^r(?<n>[0-9]+)").n | tonumber),
	       streams_per_s: (.result.done / .result.elapsed_seconds | . * 10 | round / 10),
	       fc_p50_ms: (.result.latency.all.first_chunk.p50_ms | r3), fc_p99_ms: (.result.latency.all.first_chunk.p99_ms | r3),
	       queued: (.result.paths.queued // 0), done: .result.done, lost: .result.lost, errors: .result.errors,
	       api_cpu_us_per_stream: (.cpu_seconds.api * 1e6 / .result.done | round),
	       redis_cpu_us_per_stream: (.cpu_seconds.redis * 1e6 / .result.done | round), load: .load_before})
	| . as $runs
	| {scenario: "aged", settings: {age_minutes: $age, rounds: $rounds, round_seconds: $rs},
	   runs: $runs,
	   arms: ($runs | group_by(.arm) | map({key: .[0].arm, value: {
		streams_per_s: (map(.streams_per_s) | median), fc_p50_ms: (map(.fc_p50_ms) | median | r3),
		fc_p99_ms: (map(.fc_p99_ms) | median | r3), api_cpu_us_per_stream: (map(.api_cpu_us_per_stream) | median),
		redis_cpu_us_per_stream: (map(.redis_cpu_us_per_stream) | median)}}) | from_entries),
	   lost: ($runs | map(.lost) | add), errors: ($runs | map(.errors) | add)}' \
	"$dir"/r*.json >"$RESULTS/aged.json"

jq -r 'def pad(n): tostring | if length < n then " " * (n - length) + . else . end;
	"arm         streams/s  fc p50 ms  fc p99 ms  api µs/stream  redis µs/stream   (medians of \(.settings.rounds) rounds of \(.settings.round_seconds)s; aged after \(.settings.age_minutes) min)",
	(.arms | to_entries[] | "\(.key | . + " " * (10 - length)) \(.value.streams_per_s | pad(10)) \(.value.fc_p50_ms | pad(10)) \(.value.fc_p99_ms | pad(10)) \(.value.api_cpu_us_per_stream | pad(14)) \(.value.redis_cpu_us_per_stream | pad(16))"),
	"", "round arm        streams/s  api µs/stream  load before",
	(.runs[] | "\(.round | pad(5)) \(.arm | . + " " * (10 - length)) \(.streams_per_s | pad(10)) \(.api_cpu_us_per_stream | pad(14))  \(.load)"),
	"lost \(.lost), errors \(.errors)"' "$RESULTS/aged.json" | tee "$RESULTS/aged.txt"
jq -e '.lost == 0' "$RESULTS/aged.json" >/dev/null || die "aged: streams lost (see $RESULTS/aged.json)"
