#!/usr/bin/env bash
# parity.sh: issue 31's goals 1–4, each beside its reference in one run
# (docs/BENCHMARKS.md, "Issue 31: how to run").
#
# Two phases, each with its own simllm (50-chunk answers): unpaced
# (SIM_TOKEN_MS=0) and paced (P_TOKEN_MS, 20 ms between chunks). In each:
#   upstream  simllm alone (-mode openai): the reference of "added" time;
#   hop       the bare pass-through hop (passproxy) in front of it;
#   direct    an api on its own redis-server (pool and stream log), a pool
#             far larger than any load here (CONNECTION_POOL_SIZE 100000),
#             queue failover on but nothing serving its queue: a stream the
#             pool refuses spills, waits SPILL_TIMEOUT seconds and ends
#             queue-timeout: the api counts it in spillway_streams_total
#             {path="queued"} (and the refusal behind it, when the pool
#             refused, in spillway_pool_refusals_total), the load tool as
#             an error;
#   queued    an api with DIRECT_PATH_ENABLED=false and two consumers
#             (WORKER_CONCURRENCY 128) on a second redis-server, so each
#             path's Redis CPU is its own.
# Rounds interleave the four targets ROUNDS (3) times at every concurrency
# of the phase (queued only at Q_CONC, 50), so drift in machine load hits
# all alike. Every run records the CPU seconds of every server process
# (/proc), the direct api's counters before and after (pool refusals,
# streams by path and outcome, spillway_stream_log_dropped_total, and the
# "stream log behind Redis" lines in its log) and its Redis' INFO cpu and
# used_memory before and after; the queued Redis' too.
#
# Figures (medians over rounds): streams/s of direct over the hop at each
# unpaced concurrency; CPU per chunk (api + its Redis over the hop) at each
# concurrency, both phases; the added first chunk (p50/p99 minus the same
# round's upstream) of hop, direct and queued at Q_CONC paced; queued CPU
# per chunk (api + consumers + Redis) over direct's at Q_CONC, both
# phases; spills and errors of the direct api at every run (the goal is
# read at c = 1000 paced and c = 200 unpaced); stream log entries dropped,
# and the log's Redis CPU (µs) and memory (bytes) per chunk (the direct
# api's Redis, which also serves its pool's few calls).
#
# Each run's JSON lists its 50 streams with the longest first chunk
# (result.slowest_first_chunk: start in the run, client, its place among
# the client's requests, kept-alive or new connection): what the p99 tail
# has in common.
# Writes $RESULTS/parity/*.json and $RESULTS/parity.json.
# Environment (defaults are the issue's; shrink them for a smoke test):
#   ROUNDS (3), U_CONCS ("1 50 200"), P_CONCS ("50 200 1000"), Q_CONC (50),
#   N1 (200 streams per run at c = 1), NC (2000 per run above it),
#   N_BIG (5000 per run at c ≥ 1000), W_N (500 per warm-up run, at
#   Q_CONC), TOKENS (50), P_FIRST_TOKEN_MS (50), P_TOKEN_MS (20),
#   SPILL_TIMEOUT (5), RUN_LIMIT (180 s per run at most),
#   DIRECT_POOL_SIZE (100000: the direct api's pool; a few slots make it
#   spill, to see that spills are counted),
#   PARITY_PHASES ("unpaced paced": the phases to run; "paced" with
#   P_CONCS=50 and ROUNDS=1 is the queued path's first chunk alone, about
#   4 minutes),
#   PARITY_SUMMARY_ONLY=1 runs nothing and writes parity.json again from
#   the run files already in $RESULTS/parity (with the same settings).
source "$(dirname "$0")/lib.sh"
SCENARIO=parity
require_tools jq curl redis-server redis-cli ss

ROUNDS=${ROUNDS:-3}
U_CONCS=${U_CONCS:-1 50 200}
P_CONCS=${P_CONCS:-50 200 1000}
Q_CONC=${Q_CONC:-50}
N1=${N1:-200} NC=${NC:-2000} N_BIG=${N_BIG:-5000} W_N=${W_N:-500}
TOKENS=${TOKENS:-50}
P_FT=${P_FIRST_TOKEN_MS:-50} P_TI=${P_TOKEN_MS:-20}
SPILL_TIMEOUT=${SPILL_TIMEOUT:-5}
DIRECT_POOL_SIZE=${DIRECT_POOL_SIZE:-100000}
RUN_LIMIT=${RUN_LIMIT:-180}
dir="$RESULTS/$SCENARIO"
mkdir -p "$dir"

# c = 1000 needs a socket per client in the load tool and two in the hop.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
maxc=0
for c in $U_CONCS $P_CONCS; do ((c > maxc)) && maxc=$c; done
(($(ulimit -n) >= 3 * maxc + 1000)) || die "open files limit $(ulimit -n) is too low for c = $maxc"

# api_counters METRICS_URL LOGFILE: the direct api's counters as JSON.
api_counters() {
	curl -fsS -m 5 "$1" 2>/dev/null | awk -v behind="$(grep -c 'stream log behind Redis' "$2" 2>/dev/null || true)" '
		/^spillway_pool_refusals_total[{ ]/ {refused += $NF}
		/^spillway_streams_total\{/ {
			if ($1 ~ /path="queued"/) queued += $NF
			if ($1 ~ /outcome="(error|refused)"/) failed += $NF
			if ($1 ~ /path="direct"/ && $1 ~ /outcome="done"/) direct_done += $NF}
		/^spillway_stream_log_dropped_total[{ ]/ {dropped += $NF}
		END {printf "{\"pool_refusals\": %d, \"queued\": %d, \"failed\": %d, \"direct_done\": %d, \"log_dropped\": %d, \"log_behind_lines\": %d}\n",
			refused, queued, failed, direct_done, dropped, behind + 0}'
}

# redis_json PORT: a redis-server's CPU seconds and used memory (INFO).
redis_json() {
	redis-cli -p "$1" info | tr -d '\r' | awk -F: '
		$1 == "used_cpu_sys" || $1 == "used_cpu_user" {cpu += $2}
		$1 == "used_memory" {mem = $2}
		END {printf "{\"cpu_s\": %.3f, \"used_memory\": %d}\n", cpu, mem}'
}

# measured_run NAME LOADTEST_ARGS...: run_load bounded by RUN_LIMIT, with
# the direct api's counters and both Redis' INFO before and after added to
# NAME.json as .extra.
measured_run() {
	local name=$1 a0 a1 d0 d1 q0 q1
	shift
	a0=$(api_counters "$DIRECT_METRICS" "$RESULTS/logs/$DIRECT_LOG.log")
	d0=$(redis_json "$RD_PORT")
	q0=$(redis_json "$RQ_PORT")
	run_load "$name" "$RUN_LIMIT" "$@"
	a1=$(api_counters "$DIRECT_METRICS" "$RESULTS/logs/$DIRECT_LOG.log")
	d1=$(redis_json "$RD_PORT")
	q1=$(redis_json "$RQ_PORT")
	jq --argjson a0 "$a0" --argjson a1 "$a1" --argjson d0 "$d0" --argjson d1 "$d1" --argjson q0 "$q0" --argjson q1 "$q1" \
		'def delta(x; y): y | with_entries(.value -= x[.key]);
		 . + {extra: {direct_api: delta($a0; $a1), redis_direct: delta($d0; $d1), redis_queued: delta($q0; $q1)}}' \
		"$dir/$name.json" >"$dir/$name.json.tmp" && mv "$dir/$name.json.tmp" "$dir/$name.json"
}

# phase NAME FIRST_TOKEN_MS TOKEN_MS CONCS: one phase's processes, then its
# interleaved rounds; stops its processes at the end.
phase() {
	local ph=$1 ft=$2 ti=$3 concs=$4 c i n up hop api qapi common
	CPU_PID=()
	start_simllm "simllm-$ph" "$ft" "$ti" "$TOKENS"
	CPU_PID[simllm]=$SIM_PID
	start_proxy "hop-$ph" "http://127.0.0.1:$SIM_PORT"
	CPU_PID[hop]=$PROXY_PID
	start_redis
	RD_PORT=$REDIS_PORT
	CPU_PID[redis_direct]=$REDIS_PID
	DIRECT_LOG=api-direct-$ph
	start_api "$DIRECT_LOG" CONNECTION_POOL_SIZE="$DIRECT_POOL_SIZE" CONNECTION_POOL_PER_USER="$DIRECT_POOL_SIZE" POOL_LOCAL_FALLBACK_SIZE="$DIRECT_POOL_SIZE" \
		DIRECT_PATH_ENABLED=true QUEUE_FAILOVER_ENABLED=true QUEUE_FAILOVER_TIMEOUT_SECONDS="$SPILL_TIMEOUT" \
		QUEUE_MAX_PER_IDENTITY=100000 QUEUE_OVERFLOW_THRESHOLD=100000 QUEUE_PREFIX=qd:
	CPU_PID[api_direct]=$API_PID
	DIRECT_METRICS="http://127.0.0.1:$API_PORT/metrics"
	api="http://127.0.0.1:$API_PORT/v1/stream"
	start_redis
	RQ_PORT=$REDIS_PORT
	CPU_PID[redis_queued]=$REDIS_PID
	start_api "api-queued-$ph" DIRECT_PATH_ENABLED=false CONNECTION_POOL_SIZE=100000 CONNECTION_POOL_PER_USER=100000 \
		QUEUE_MAX_PER_IDENTITY=100000 QUEUE_OVERFLOW_THRESHOLD=100000 QUEUE_PREFIX=qq:
	CPU_PID[api_queued]=$API_PID
	qapi="http://127.0.0.1:$API_PORT/v1/stream"
	for i in 1 2; do
		start_consumer "consumer-$ph-$i" QUEUE_PREFIX=qq: CONNECTION_POOL_SIZE=100000 CONNECTION_POOL_PER_USER=100000 WORKER_CONCURRENCY=128
		CPU_PID[consumer_$i]=$CONSUMER_PID
	done
	up="http://127.0.0.1:$SIM_PORT/v1/chat/completions"
	hop="http://127.0.0.1:$PROXY_PORT/v1/chat/completions"
	common=(-tokens "$TOKENS" -seed 1 -prompts 200 -timeout 60s -slowest 50)

	log "parity $ph: warm-up"
	measured_run "$ph-warmup-hop" -mode openai -url "$hop" -c "$Q_CONC" -n "$W_N" "${common[@]}"
	measured_run "$ph-warmup-direct" -url "$api" -c "$Q_CONC" -n "$W_N" "${common[@]}"
	measured_run "$ph-warmup-queued" -url "$qapi" -c "$Q_CONC" -n "$W_N" "${common[@]}"
	for ((i = 1; i <= ROUNDS; i++)); do
		for c in $concs; do
			n=$NC
			((c == 1)) && n=$N1
			((c >= 1000)) && n=$N_BIG
			measured_run "$ph-c$c-p$i-upstream" -mode openai -url "$up" -c "$c" -n "$n" "${common[@]}"
			measured_run "$ph-c$c-p$i-hop" -mode openai -url "$hop" -c "$c" -n "$n" "${common[@]}"
			measured_run "$ph-c$c-p$i-direct" -url "$api" -c "$c" -n "$n" "${common[@]}"
			((c == Q_CONC)) && measured_run "$ph-c$c-p$i-queued" -url "$qapi" -c "$c" -n "$n" "${common[@]}"
		done
	done
	stop_all
}

PARITY_PHASES=${PARITY_PHASES:-unpaced paced}
for ph in $PARITY_PHASES; do
	[[ $ph == unpaced || $ph == paced ]] || die "PARITY_PHASES: unknown phase $ph (unpaced, paced)"
done
if [[ ${PARITY_SUMMARY_ONLY:-0} != 1 ]]; then
	if [[ " $PARITY_PHASES " == *" unpaced "* ]]; then phase unpaced 0 0 "$U_CONCS"; fi
	if [[ " $PARITY_PHASES " == *" paced "* ]]; then phase paced "$P_FT" "$P_TI" "$P_CONCS"; fi
fi

# --- summary ---
jq -s --argjson tok "$TOKENS" --argjson qc "$Q_CONC" \
	--arg settings "$(jq -cn --argjson rounds "$ROUNDS" --arg u "$U_CONCS" --arg p "$P_CONCS" --argjson qc "$Q_CONC" \
		--argjson n1 "$N1" --argjson nc "$NC" --argjson nbig "$N_BIG" --argjson tok "$TOKENS" --argjson pft "$P_FT" \
		--argjson pti "$P_TI" --argjson spill "$SPILL_TIMEOUT" \
		'{rounds: $rounds, unpaced_concurrency: ($u | split(" ") | map(select(. != "") | tonumber)),
		  paced_concurrency: ($p | split(" ") | map(select(. != "") | tonumber)), queued_concurrency: $qc,
		  n1: $n1, n: $nc, n_big: $nbig, tokens: $tok, paced_first_token_ms: $pft, paced_token_ms: $pti, spill_timeout_s: $spill}')" \
	"$JQ_DEFS"'
	def lbl: .run | capture("^(?<ph>unpaced|paced)-c(?<c>[0-9]+)-p(?<i>[0-9]+)-(?<t>.*)$");
	def chunks: .result.done * $tok;
	def tput: if .result.elapsed_seconds > 0 then .result.done / .result.elapsed_seconds else null end;
	# CPU µs per chunk of the processes a target runs on.
	def cpu_chunk: (.cpu_seconds as $c | lbl.t as $t
		| (if $t == "hop" then $c.hop elif $t == "direct" then $c.api_direct + $c.redis_direct
		   elif $t == "queued" then $c.api_queued + ($c.consumer_1 // 0) + ($c.consumer_2 // 0) + $c.redis_queued
		   else $c.simllm end)) as $s
		| if chunks > 0 then $s * 1e6 / chunks else null end;
	def ratio(a; b): if a == null or b == null or b == 0 then null else a / b | r3 end;
	map(select(type == "object" and (.run // "" | test("^(unpaced|paced)-c[0-9]+-p[0-9]+-")))) as $runs
	| [$runs[] | {ph: lbl.ph, c: (lbl.c | tonumber), i: (lbl.i | tonumber), t: lbl.t,
		done: .result.done, errors: .result.errors, refused: .result.refused, lost: .result.lost, paths: .result.paths,
		streams_per_s: tput, cpu_us_per_chunk: cpu_chunk,
		fc_p50: .result.latency.all.first_chunk.p50_ms, fc_p99: .result.latency.all.first_chunk.p99_ms,
		load: .load_before, extra: .extra}] as $rows
	| def at($ph; $c; $i; $t): $rows | map(select(.ph == $ph and .c == $c and .i == $i and .t == $t))[0];
	  def rounds($ph; $c): $rows | map(select(.ph == $ph and .c == $c) | .i) | unique;
	  def per_round($ph; $c; f): [rounds($ph; $c)[] | f] | map(select(. != null));
	  def cell($ph; $c): {
		streams_per_s: ({upstream: "upstream", hop: "hop", direct: "direct", queued: "queued"}
			| map_values(. as $t | per_round($ph; $c; at($ph; $c; .; $t).streams_per_s) | median | r3)),
		cpu_us_per_chunk: ({hop: "hop", direct: "direct", queued: "queued"}
			| map_values(. as $t | per_round($ph; $c; at($ph; $c; .; $t).cpu_us_per_chunk) | median | r3)),
		direct_over_hop_streams_per_s: (per_round($ph; $c; ratio(at($ph; $c; .; "direct").streams_per_s; at($ph; $c; .; "hop").streams_per_s)) | median),
		direct_over_hop_cpu_per_chunk: (per_round($ph; $c; ratio(at($ph; $c; .; "direct").cpu_us_per_chunk; at($ph; $c; .; "hop").cpu_us_per_chunk)) | median),
		queued_over_direct_cpu_per_chunk: (per_round($ph; $c; ratio(at($ph; $c; .; "queued").cpu_us_per_chunk; at($ph; $c; .; "direct").cpu_us_per_chunk)) | median),
		added_first_chunk_ms: ({hop: "hop", direct: "direct", queued: "queued"} | map_values(. as $t | {
			p50: (per_round($ph; $c; (at($ph; $c; .; $t).fc_p50 // null) as $b | (at($ph; $c; .; "upstream").fc_p50) as $a
				| if $b == null or $a == null then null else $b - $a end) | median | r3),
			p99: (per_round($ph; $c; (at($ph; $c; .; $t).fc_p99 // null) as $b | (at($ph; $c; .; "upstream").fc_p99) as $a
				| if $b == null or $a == null then null else $b - $a end) | median | r3)})),
		direct_minus_hop_first_chunk_ms: {
			p50: (per_round($ph; $c; at($ph; $c; .; "direct").fc_p50 as $b | at($ph; $c; .; "hop").fc_p50 as $a
				| if $b == null or $a == null then null else $b - $a end) | median | r3),
			p99: (per_round($ph; $c; at($ph; $c; .; "direct").fc_p99 as $b | at($ph; $c; .; "hop").fc_p99 as $a
				| if $b == null or $a == null then null else $b - $a end) | median | r3)},
		direct_spills: {
			pool_refusals: (per_round($ph; $c; at($ph; $c; .; "direct").extra.direct_api.pool_refusals) | add),
			queued_streams: (per_round($ph; $c; at($ph; $c; .; "direct").extra.direct_api.queued) | add),
			failed_streams: (per_round($ph; $c; at($ph; $c; .; "direct").extra.direct_api.failed) | add),
			loadtest_errors: (per_round($ph; $c; at($ph; $c; .; "direct") | .errors + .refused) | add)},
		stream_log: {
			dropped: (per_round($ph; $c; at($ph; $c; .; "direct").extra.direct_api.log_dropped) | add),
			behind_lines: (per_round($ph; $c; at($ph; $c; .; "direct").extra.direct_api.log_behind_lines) | add),
			redis_cpu_us_per_chunk: (per_round($ph; $c; at($ph; $c; .; "direct") | if .done > 0 then .extra.redis_direct.cpu_s * 1e6 / (.done * $tok) else null end) | median | r3),
			redis_memory_bytes_per_chunk: (per_round($ph; $c; at($ph; $c; .; "direct") | if .done > 0 then .extra.redis_direct.used_memory / (.done * $tok) else null end) | median | r3)},
		lost: (per_round($ph; $c; [at($ph; $c; .; "upstream", "hop", "direct", "queued") | .lost? // 0] | add) | add)};
	{scenario: "parity", settings: ($settings | fromjson),
	 unpaced: ($rows | map(select(.ph == "unpaced") | .c) | unique | map({key: "c\(.)", value: cell("unpaced"; .)}) | from_entries),
	 paced: ($rows | map(select(.ph == "paced") | .c) | unique | map({key: "c\(.)", value: cell("paced"; .)}) | from_entries),
	 log_dropped_total: ([$runs[] | .extra.direct_api.log_dropped] | add),
	 lost: ($rows | map(.lost) | add),
	 runs: $rows}' "$dir"/*.json >"$RESULTS/parity.json"

jq -r '(["unpaced", "paced"][] as $ph | .[$ph] | to_entries[] |
	"parity \($ph) c=\(.key | ltrimstr("c")): streams/s hop \(.value.streams_per_s.hop) direct \(.value.streams_per_s.direct) (\(.value.direct_over_hop_streams_per_s)x); CPU µs/chunk hop \(.value.cpu_us_per_chunk.hop) direct \(.value.cpu_us_per_chunk.direct) (\(.value.direct_over_hop_cpu_per_chunk)x) queued \(.value.cpu_us_per_chunk.queued) (\(.value.queued_over_direct_cpu_per_chunk)x direct); added first chunk p50/p99 ms hop \(.value.added_first_chunk_ms.hop.p50)/\(.value.added_first_chunk_ms.hop.p99) direct \(.value.added_first_chunk_ms.direct.p50)/\(.value.added_first_chunk_ms.direct.p99) queued \(.value.added_first_chunk_ms.queued.p50)/\(.value.added_first_chunk_ms.queued.p99); spills \(.value.direct_spills.pool_refusals) refusals \(.value.direct_spills.queued_streams) queued \(.value.direct_spills.loadtest_errors) errors; log dropped \(.value.stream_log.dropped), Redis \(.value.stream_log.redis_cpu_us_per_chunk) µs and \(.value.stream_log.redis_memory_bytes_per_chunk) B per chunk; lost \(.value.lost)")' \
	"$RESULTS/parity.json" >&2
jq -e '.lost == 0' "$RESULTS/parity.json" >/dev/null || die "parity: streams lost (see $RESULTS/parity.json)"
