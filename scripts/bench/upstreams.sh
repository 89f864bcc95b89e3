#!/usr/bin/env bash
# upstreams.sh: three upstream replicas of different speeds behind one api
# and 2 consumers, each replica capped, under load at twice their total
# capacity, routed least-loaded and weighted (docs/BENCHMARKS.md,
# "Scenario: several upstreams").
#
# Replicas: simllm with SIM_FIRST_TOKEN_MS=UP_FT (50) and SIM_TOKENS=UP_TOK
# (16), SIM_TOKEN_MS 10, 20 and 40 (UP_TOKEN_MS): a fast, a middling and a
# slow replica. Each has max_concurrency UP_CAP (4) in the YAML upstreams
# list, so their total capacity is 3 × UP_CAP calls at once. The api and
# the consumers share POOL_BACKEND=redis with CONNECTION_POOL_SIZE=UP_POOL
# (2 × the caps): a request with a pool slot but every replica at its cap
# goes to the queue, where a worker waits for a replica slot.
#
# Runs, each on fresh replicas, api and consumers: for each routing
# (least-loaded with weights 1; weighted with UP_WEIGHTS, 4:2:1, the
# replicas' speeds) the load tool keeps UP_LOAD concurrent clients (2 × the
# caps) for UP_SECONDS (20), then UP_LOW (half the caps) clients for as
# long, below capacity; a last run below capacity gives least-loaded the
# same weights. Each run reports streams/s, first-chunk and total
# p50/p99, paths, and per replica its calls (its share) and the most calls
# it ever had at once (simllm_active_streams_peak), which must not pass
# UP_CAP.
#
# Writes $RESULTS/upstreams/*.json and $RESULTS/upstreams.json.
source "$(dirname "$0")/lib.sh"
SCENARIO=upstreams
require_tools jq curl redis-server redis-cli ss

read -r -a TOKEN_MS <<<"${UP_TOKEN_MS:-10 20 40}"
read -r -a WEIGHTS <<<"${UP_WEIGHTS:-4 2 1}"
UP_FT=${UP_FT:-50}
UP_TOK=${UP_TOK:-16}
UP_CAP=${UP_CAP:-4}
UP_SECONDS=${UP_SECONDS:-20}
CAPS=$((${#TOKEN_MS[@]} * UP_CAP))
UP_POOL=${UP_POOL:-$((2 * CAPS))}
UP_LOAD=${UP_LOAD:-$((2 * CAPS))}
UP_LOW=${UP_LOW:-$((CAPS / 2))}
((${#TOKEN_MS[@]} == ${#WEIGHTS[@]})) || die "UP_TOKEN_MS and UP_WEIGHTS need as many entries"

start_redis
mkdir -p "$RESULTS/$SCENARIO"

# run ROUTING LABEL CLIENTS WEIGHTED: one run on fresh processes.
run() {
	local routing=$1 label=$2 clients=$3 weighted=$4 i yaml ports=() pids=() start=${#PIDS[@]}
	yaml=$RESULTS/$SCENARIO/$label.yaml
	echo "upstreams:" >"$yaml"
	for i in "${!TOKEN_MS[@]}"; do
		start_simllm "simllm-$label-$i" "$UP_FT" "${TOKEN_MS[i]}" "$UP_TOK"
		ports+=("$SIM_PORT")
		pids+=("$SIM_PID")
		local w=1
		[[ $weighted == 1 ]] && w=${WEIGHTS[i]}
		echo "  - {name: replica-$i, base_url: \"http://127.0.0.1:$SIM_PORT/v1\", weight: $w, max_concurrency: $UP_CAP}" >>"$yaml"
	done
	local common=(REDIS_URL="$REDIS_URL" QUEUE_PREFIX="up-$label:" LLM_PROVIDER=openai LLM_ROUTING="$routing"
		POOL_BACKEND=redis CONNECTION_POOL_SIZE="$UP_POOL" CONNECTION_POOL_PER_USER="$UP_POOL"
		QUEUE_DEPTH_CACHE_TTL_MS=100 LOG_LEVEL=warn)
	free_port
	local api_port=$PORT
	start_proc "api-$label" env HTTP_ADDR="127.0.0.1:$api_port" EMBEDDED_WORKERS=false "${common[@]}" \
		"$BIN/api" -config "$yaml"
	local api_pid=$REPLY
	wait_http "http://127.0.0.1:$api_port/readyz" "$api_pid"
	CPU_PID=([redis]=$REDIS_PID [api]=$api_pid)
	for c in 1 2; do
		free_port
		start_proc "consumer-$label-$c" env CONSUMER_HTTP_ADDR="127.0.0.1:$PORT" WORKER_CONCURRENCY="$UP_LOAD" \
			"${common[@]}" "$BIN/consumer" -config "$yaml"
		CPU_PID[consumer_$c]=$REPLY
		wait_http "http://127.0.0.1:$PORT/healthz" "$REPLY"
	done

	log "$label: $routing, $clients clients on ${#TOKEN_MS[@]} replicas capped at $UP_CAP each"
	run_load "$label" $((UP_SECONDS + 90)) -url "http://127.0.0.1:$api_port/v1/stream" -c "$clients" -n 0 \
		-d "${UP_SECONDS}s" -users "$clients" -prompts 64 -tokens "$UP_TOK" -seed 1 -timeout 60s

	local reps='[]' calls peak
	for i in "${!ports[@]}"; do
		calls=$(metric "http://127.0.0.1:${ports[i]}/metrics" simllm_requests_total)
		peak=$(metric "http://127.0.0.1:${ports[i]}/metrics" simllm_active_streams_peak)
		reps=$(jq -c --arg n "replica-$i" --argjson ms "${TOKEN_MS[i]}" --argjson c "$calls" --argjson p "$peak" \
			--argjson w "$([[ $weighted == 1 ]] && echo "${WEIGHTS[i]}" || echo 1)" \
			'. + [{name: $n, token_ms: $ms, weight: $w, calls: $c, peak: $p}]' <<<"$reps")
	done
	jq --argjson reps "$reps" --arg routing "$routing" --argjson clients "$clients" \
		'. + {routing: $routing, clients: $clients, replicas: $reps}' \
		"$RESULTS/$SCENARIO/$label.json" >"$RESULTS/$SCENARIO/$label.tmp" &&
		mv "$RESULTS/$SCENARIO/$label.tmp" "$RESULTS/$SCENARIO/$label.json"
	# Stop this run's processes, newest first.
	for ((i = ${#PIDS[@]} - 1; i >= start; i--)); do
		stop_pid "${PIDS[i]}"
	done
}

run least-loaded least-loaded-2x "$UP_LOAD" 0
run weighted weighted-2x "$UP_LOAD" 1
run least-loaded least-loaded-half "$UP_LOW" 0
run weighted weighted-half "$UP_LOW" 1
run least-loaded least-loaded-weights-half "$UP_LOW" 1

d=$RESULTS/$SCENARIO
jq -s --argjson cap "$UP_CAP" --argjson pool "$UP_POOL" --argjson secs "$UP_SECONDS" --argjson ft "$UP_FT" \
	--argjson tok "$UP_TOK" "$JQ_DEFS"'
	def summary: {routing, clients, done: .result.done, errors: .result.errors, lost: .result.lost,
		refused: .result.refused, paths: .result.paths,
		streams_per_s: (if .result.elapsed_seconds > 0 then .result.done / .result.elapsed_seconds | r3 else null end),
		first_chunk_p50_ms: .result.latency.all.first_chunk.p50_ms, first_chunk_p99_ms: .result.latency.all.first_chunk.p99_ms,
		total_p50_ms: .result.latency.all.total.p50_ms, total_p99_ms: .result.latency.all.total.p99_ms,
		replicas: ((.replicas | map(.calls) | add) as $all
			| .replicas | map(. + {share: (if $all > 0 then .calls / $all | r3 else null end)})),
		load: .load_before, cpu_seconds};
	{scenario: "upstreams",
	 settings: {replicas: (.[0].replicas | map({name, token_ms})), cap_each: $cap, pool: $pool, seconds: $secs,
		sim_first_token_ms: $ft, sim_tokens: $tok, consumers: 2},
	 runs: (map({key: .run, value: summary}) | from_entries),
	 outcome: {lost: (map(.result.lost) | add),
		caps_exceeded: ([.[].replicas[] | select(.peak > $cap)] | length)}}' \
	"$d/least-loaded-2x.json" "$d/weighted-2x.json" "$d/least-loaded-half.json" "$d/weighted-half.json" \
	"$d/least-loaded-weights-half.json" \
	>"$RESULTS/upstreams.json"

jq -r '.runs | to_entries[] | .value as $r | "\(.key): \($r.streams_per_s) streams/s, first chunk p50/p99 \($r.first_chunk_p50_ms)/\($r.first_chunk_p99_ms) ms, total p50 \($r.total_p50_ms) ms, shares \($r.replicas | map("\(.name) \(.share) (peak \(.peak))") | join(", ")), lost \($r.lost)"' \
	"$RESULTS/upstreams.json" >&2
jq -e '.outcome.lost == 0 and .outcome.caps_exceeded == 0' "$RESULTS/upstreams.json" >/dev/null ||
	die "upstreams: streams lost or a cap exceeded (see $RESULTS/upstreams.json)"
