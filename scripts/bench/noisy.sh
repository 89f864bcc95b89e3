#!/usr/bin/env bash
# noisy.sh: one identity flooding at 10× its share must not slow the others
# (docs/QUEUE.md, "Fairness").
#
# One simllm; one api and 2 consumers sharing POOL_BACKEND=redis with
# CONNECTION_POOL_SIZE=NOISY_POOL (16) and CONNECTION_POOL_PER_USER=2
# (an identity's share: 2 streams at once); WORKER_CONCURRENCY=NOISY_WORKERS
# (4) per consumer. The others: NOISY_OTHERS (6) identities, one client each
# (loadtest -users), a NOISY_THINK (200ms) pause between requests: normal
# rates, within their share. Run 1 ("baseline"): the others alone for
# NOISY_SECONDS (15). Run 2 ("flood"): the same, while identity "noisy"
# keeps 10 × 2 = 20 streams open at once with no pause (10× its share).
# Reports the others' first-chunk p50/p99 in both runs, the flood's
# outcomes, and that nothing was lost. NOISY_DIRECT_PATH=false runs the api
# with DIRECT_PATH_ENABLED=false, so every request goes through the queue
# and the consumers' scheduling alone keeps the others' wait short.
#
# Writes $RESULTS/noisy/{baseline,others,flood}.json and $RESULTS/noisy.json.
source "$(dirname "$0")/lib.sh"
SCENARIO=noisy
require_tools jq curl redis-server redis-cli ss

NOISY_POOL=${NOISY_POOL:-16}
NOISY_WORKERS=${NOISY_WORKERS:-4}
NOISY_OTHERS=${NOISY_OTHERS:-6}
NOISY_THINK=${NOISY_THINK:-200ms}
NOISY_SECONDS=${NOISY_SECONDS:-15}
NOISY_DIRECT_PATH=${NOISY_DIRECT_PATH:-true}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-20} TOK=${SIM_TOKENS:-16}

start_redis
start_simllm simllm "$FT" "$TI" "$TOK"
common=(POOL_BACKEND=redis CONNECTION_POOL_SIZE="$NOISY_POOL" CONNECTION_POOL_PER_USER=2
	QUEUE_DEPTH_CACHE_TTL_MS=100)
start_api api "${common[@]}" DIRECT_PATH_ENABLED="$NOISY_DIRECT_PATH"
CPU_PID=([redis]=$REDIS_PID [simllm]=$SIM_PID [api]=$API_PID)
for i in 1 2; do
	start_consumer "consumer-$i" "${common[@]}" WORKER_CONCURRENCY="$NOISY_WORKERS"
	CPU_PID[consumer_$i]=$CONSUMER_PID
done
URL="http://127.0.0.1:$API_PORT/v1/stream"
others=(-url "$URL" -c "$NOISY_OTHERS" -users "$NOISY_OTHERS" -n 0 -d "${NOISY_SECONDS}s"
	-think "$NOISY_THINK" -prompts 64 -tokens "$TOK" -seed 1 -timeout 60s)
limit=$((NOISY_SECONDS + 90))

log "baseline: $NOISY_OTHERS identities at normal rates, no flood"
load_start baseline "$limit" "${others[@]}"
load_finish baseline

log "flood: identity noisy at 20 streams at once (10x its share) beside the same $NOISY_OTHERS"
load_start flood "$limit" -url "$URL" -c 20 -n 0 -d "${NOISY_SECONDS}s" -H "X-User-ID: noisy" \
	-prompts 64 -tokens "$TOK" -seed 1 -timeout 60s
load_start others "$limit" "${others[@]}"
load_finish others
load_finish flood

d=$RESULTS/noisy
jq -n --slurpfile b "$d/baseline.json" --slurpfile o "$d/others.json" --slurpfile f "$d/flood.json" \
	--argjson pool "$NOISY_POOL" --argjson workers "$NOISY_WORKERS" --argjson others "$NOISY_OTHERS" \
	--arg think "$NOISY_THINK" --argjson direct "$NOISY_DIRECT_PATH" --argjson secs "$NOISY_SECONDS" --argjson ft "$FT" --argjson ti "$TI" --argjson tok "$TOK" '
	def fc(r): r.result.latency.all.first_chunk;
	{scenario: "noisy",
	 settings: {pool: $pool, per_user: 2, consumers: 2, worker_concurrency: $workers, others: $others,
		others_think: $think, flood_concurrency: 20, direct_path: $direct, seconds: $secs,
		sim_first_token_ms: $ft, sim_token_ms: $ti, sim_tokens: $tok},
	 others_baseline: {done: $b[0].result.done, errors: $b[0].result.errors, lost: $b[0].result.lost, paths: $b[0].result.paths,
		first_chunk_p50_ms: fc($b[0]).p50_ms, first_chunk_p99_ms: fc($b[0]).p99_ms},
	 others_under_flood: {done: $o[0].result.done, errors: $o[0].result.errors, errors_by_type: $o[0].result.errors_by_type,
		lost: $o[0].result.lost, paths: $o[0].result.paths,
		first_chunk_p50_ms: fc($o[0]).p50_ms, first_chunk_p99_ms: fc($o[0]).p99_ms},
	 flood: {done: $f[0].result.done, errors: $f[0].result.errors, errors_by_type: $f[0].result.errors_by_type,
		refused: $f[0].result.refused, lost: $f[0].result.lost, paths: $f[0].result.paths,
		first_chunk_p50_ms: fc($f[0]).p50_ms, first_chunk_p99_ms: fc($f[0]).p99_ms},
	 outcome: {lost: ($b[0].result.lost + $o[0].result.lost + $f[0].result.lost)},
	 load: {baseline: $b[0].load_before, flood: $o[0].load_before}}' >"$RESULTS/noisy.json"

jq -r '"noisy: others first chunk p50/p99 \(.others_baseline.first_chunk_p50_ms)/\(.others_baseline.first_chunk_p99_ms) ms alone, \(.others_under_flood.first_chunk_p50_ms)/\(.others_under_flood.first_chunk_p99_ms) ms under the flood; flood \(.flood.done) done, \(.flood.errors) errors; lost \(.outcome.lost)"' \
	"$RESULTS/noisy.json" >&2
jq -e '.outcome.lost == 0' "$RESULTS/noisy.json" >/dev/null || die "noisy: streams were lost (see $RESULTS/noisy.json)"
