#!/usr/bin/env bash
# profile.sh: CPU profiles of the api's direct path at PROFILE_CONCS
# concurrent paced streams, for docs/BENCHMARKS.md ("Profiles").
#
# One paced simllm (as direct.sh), one api (pool large enough, no queue),
# and, when BASELINE_BIN names another build's directory, a second api of
# that build. For each concurrency and each api in turn: the load tool runs
# for PROFILE_SECONDS + a margin while a PROFILE_SECONDS CPU profile of the
# api is taken, then `go tool pprof -top` of it is written beside it.
# Not part of run.sh's default scenarios: SCENARIOS=profile runs it.
#
# Writes $RESULTS/profile/{api,api-base}.c<N>.cpu.pprof and .top.txt, and
# $RESULTS/profile.json (the load runs).
# Environment: PROFILE_CONCS ("50 200"), PROFILE_SECONDS (15),
# SIM_FIRST_TOKEN_MS/SIM_TOKEN_MS/SIM_TOKENS (50/5/16), BASELINE_BIN.
source "$(dirname "$0")/lib.sh"
SCENARIO=profile
require_tools jq curl redis-server redis-cli ss go

PROFILE_CONCS=${PROFILE_CONCS:-50 200}
PROFILE_SECONDS=${PROFILE_SECONDS:-15}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-5} TOK=${SIM_TOKENS:-16}
BENCH_PROFILE=1 # the apis need their -pprof listener
dir="$RESULTS/profile"
mkdir -p "$dir"

start_redis
start_simllm simllm "$FT" "$TI" "$TOK"
env_direct=(CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000 POOL_LOCAL_FALLBACK_SIZE=1000 DIRECT_PATH_ENABLED=true QUEUE_FAILOVER_ENABLED=false)
declare -A URL PPROF BINOF
start_api api "${env_direct[@]}"
URL[api]="http://127.0.0.1:$API_PORT/v1/stream" PPROF[api]=$PPROF_ADDR BINOF[api]=${API_BIN:-$BIN/api}
labels=(api)
if [[ -n ${BASELINE_BIN:-} ]]; then
	API_BIN=$BASELINE_BIN/api start_api api-base "${env_direct[@]}"
	URL[api-base]="http://127.0.0.1:$API_PORT/v1/stream" PPROF[api-base]=$PPROF_ADDR BINOF[api-base]=$BASELINE_BIN/api
	labels+=(api-base)
fi
common=(-tokens "$TOK" -seed 1 -prompts 200 -timeout 60s)
for l in "${labels[@]}"; do
	run_load "warmup-$l" 60 -url "${URL[$l]}" -c 200 -n 1000 "${common[@]}"
done
for c in $PROFILE_CONCS; do
	for l in "${labels[@]}"; do
		out="$dir/$l.c$c.cpu.pprof"
		load_start "c$c-$l" $((PROFILE_SECONDS + 60)) -url "${URL[$l]}" -c "$c" -d "$((PROFILE_SECONDS + 2))s" -n 0 "${common[@]}"
		sleep 1
		curl -fsS -m $((PROFILE_SECONDS + 30)) -o "$out" "http://${PPROF[$l]}/debug/pprof/profile?seconds=$PROFILE_SECONDS"
		load_finish "c$c-$l"
		go tool pprof -top -nodecount=25 "${BINOF[$l]}" "$out" >"${out%.cpu.pprof}.top.txt" 2>/dev/null
		go tool pprof -top -cum -nodecount=60 "${BINOF[$l]}" "$out" >"${out%.cpu.pprof}.cum.txt" 2>/dev/null
	done
done
jq -s 'map({key: .run, value: {done: .result.done, lost: .result.lost, errors: .result.errors, refused: .result.refused,
	streams_per_s: (.result.done / .result.elapsed_seconds), first_chunk: .result.latency.all.first_chunk, load_before}}) | from_entries' \
	"$dir"/c*.json >"$RESULTS/profile.json"
log "profiles in $dir"
jq -e '[.[] | .lost] | add == 0' "$RESULTS/profile.json" >/dev/null || die "profile: streams lost (see $RESULTS/profile.json)"
