#!/usr/bin/env bash
# scale.sh: N api processes behind a load balancer and M consumers on a
# 3-primary Redis Cluster, for (N,M) in SCALE_SHAPES ("1,1 2,2 4,4").
#
# One Redis Cluster (start_redis_cluster 3) and one simllm serve every
# shape; each shape has its own QUEUE_PREFIX, so nothing carries over. Per
# shape: N apis with DIRECT_PATH_ENABLED=false (every stream queued),
# QUEUE_SHARDS=3 and the Redis pool (CONNECTION_POOL_SIZE=1000, so the
# provider is not the limit); M consumers whose WORKER_CONCURRENCY adds up
# to SCALE_WORKERS (256) over the shape, so worker slots are never short
# and never grow with M; `loadtest -balance` in front of the apis (least
# connections, streamed, as nginx in configs/nginx.conf). The load tool
# runs SCALE_C (200) clients, each streaming again at once, through the
# balancer: a warm-up of 500 streams, then SCALE_N (3000) streams measured.
# The shapes run in turn SCALE_ROUNDS (2) times, so a shape's figures are
# medians over rounds spread across the whole run, not one moment of a
# shared machine.
# Recorded per shape: streams/s, queued first-chunk p50/p99, CPU seconds of
# every process (summed per tier), and per cluster node the Redis commands
# of the run (INFO commandstats before and after): SPUBLISH calls per node
# are the result messages per shard.
#
# Writes $RESULTS/scale/*.json and $RESULTS/scale.json. Environment:
# SCALE_SHAPES, SCALE_C, SCALE_N, SCALE_WORKERS, SCALE_ROUNDS, SIM_* (50/5/16).
source "$(dirname "$0")/lib.sh"
SCENARIO=scale
require_tools jq curl redis-server redis-cli ss

SCALE_SHAPES=${SCALE_SHAPES:-1,1 2,2 4,4}
SCALE_C=${SCALE_C:-200}
SCALE_N=${SCALE_N:-3000}
SCALE_WORKERS=${SCALE_WORKERS:-256}
SCALE_ROUNDS=${SCALE_ROUNDS:-2}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-5} TOK=${SIM_TOKENS:-16}

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
dir="$RESULTS/scale"
mkdir -p "$dir"
start_redis_cluster 3
start_simllm simllm "$FT" "$TI" "$TOK"

# commandstats PORT: the node's calls per command, as a JSON object.
commandstats() {
	redis-cli -p "$1" info commandstats | tr -d '\r' |
		awk -F'[:=,]' '/^cmdstat_/ {sub("cmdstat_", "", $1); printf "%s%s\"%s\":%s", sep, "", $1, $3; sep=","} BEGIN {printf "{"} END {print "}"}'
}
# cluster_stats: {"<port>": {command: calls}} for every node.
cluster_stats() {
	local port out='{}'
	for port in "${CLUSTER_PORTS[@]}"; do
		out=$(jq -c --arg p "$port" --argjson s "$(commandstats "$port")" '. + {($p): $s}' <<<"$out")
	done
	echo "$out"
}

common=(-tokens "$TOK" -seed 1 -prompts 500 -users 200 -timeout 60s -c "$SCALE_C")
for ((round = 1; round <= SCALE_ROUNDS; round++)); do for shape in $SCALE_SHAPES; do
	n=${shape%,*} m=${shape#*,}
	run="n$n-m$m-r$round"
	prefix="s${n}x${m}r$round:"
	settings=(DIRECT_PATH_ENABLED=false QUEUE_PREFIX="$prefix" QUEUE_SHARDS=3 POOL_BACKEND=redis
		CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000 QUEUE_MAX_PER_IDENTITY=1000)
	CPU_PID=([simllm]=$SIM_PID)
	for ((i = 0; i < ${#CLUSTER_PIDS[@]}; i++)); do CPU_PID[redis_$((i + 1))]=${CLUSTER_PIDS[i]}; done
	apis=() started=()
	for ((i = 1; i <= n; i++)); do
		start_api "api-$run-$i" "${settings[@]}"
		apis+=("http://127.0.0.1:$API_PORT")
		CPU_PID[api_$i]=$API_PID
		started+=("$API_PID")
	done
	for ((i = 1; i <= m; i++)); do
		start_consumer "consumer-$run-$i" "${settings[@]}" WORKER_CONCURRENCY=$((SCALE_WORKERS / m))
		CPU_PID[consumer_$i]=$CONSUMER_PID
		started+=("$CONSUMER_PID")
	done
	free_port
	LB_PORT=$PORT
	start_proc "balancer-$run" "$BIN/loadtest" -balance "127.0.0.1:$LB_PORT" \
		-backends "$(
			IFS=,
			echo "${apis[*]}"
		)"
	CPU_PID[balancer]=$REPLY
	started+=("$REPLY")
	wait_http "http://127.0.0.1:$LB_PORT/healthz" "$REPLY"
	URL="http://127.0.0.1:$LB_PORT/v1/stream"

	log "round $round, shape $n api x $m consumer: warm-up"
	run_load "$run-warmup" 120 -url "$URL" -n 500 "${common[@]}"
	before=$(cluster_stats)
	run_load "$run" 300 -url "$URL" -n "$SCALE_N" "${common[@]}"
	after=$(cluster_stats)
	jq -n --argjson b "$before" --argjson a "$after" \
		'$a | with_entries(.key as $k | .value |= with_entries(.value -= ($b[$k][.key] // 0) | select(.value > 0)))' \
		>"$dir/$run.redis.json"
	for ((i = ${#started[@]} - 1; i >= 0; i--)); do stop_pid "${started[i]}"; done
done; done

# --- summary ---
# One object per measured run, then the medians per shape.
runs_json=$(for ((round = 1; round <= SCALE_ROUNDS; round++)); do for shape in $SCALE_SHAPES; do
	n=${shape%,*} m=${shape#*,}
	run="n$n-m$m-r$round"
	jq -c --argjson n "$n" --argjson m "$m" --argjson round "$round" --slurpfile r "$dir/$run.redis.json" '
		def tier(p): [.cpu_seconds | to_entries[] | select(.key | startswith(p)) | .value] | add;
		def per_stream(p): tier(p) * 1000 / .result.done * 100 | round / 100;
		{apis: $n, consumers: $m, round: $round, done: .result.done, errors: .result.errors,
		 refused: .result.refused, lost: .result.lost, paths: .result.paths, elapsed_s: .result.elapsed_seconds,
		 streams_per_s: (.result.done / .result.elapsed_seconds * 10 | round / 10),
		 first_chunk_p50_ms: (.result.latency.all.first_chunk.p50_ms * 10 | round / 10),
		 first_chunk_p99_ms: (.result.latency.all.first_chunk.p99_ms * 10 | round / 10),
		 cpu_ms_per_stream: {api: per_stream("api"), consumer: per_stream("consumer"), redis: per_stream("redis"),
		                     balancer: per_stream("balancer"), simllm: per_stream("simllm")},
		 redis_per_node: ($r[0] | map_values({spublish: (.spublish // 0), xadd: (.xadd // 0),
		                     xreadgroup: (.xreadgroup // 0), xack: (.xack // 0),
		                     scripts: ((.evalsha // 0) + (.eval // 0) + (.fcall // 0)), all: ([.[]] | add)})),
		 load: .load_before}
		| . as $o | .spublish_per_s_per_node = ($o.redis_per_node | [.[] | .spublish / $o.elapsed_s | round])
		| .commands_per_s_per_node = ($o.redis_per_node | [.[] | .all / $o.elapsed_s | round])' "$dir/$run.json"
done; done | jq -s .)
jq -n --argjson runs "$runs_json" --argjson c "$SCALE_C" --argjson n "$SCALE_N" --argjson w "$SCALE_WORKERS" \
	--argjson rounds "$SCALE_ROUNDS" --argjson ft "$FT" --argjson ti "$TI" --argjson tok "$TOK" "$JQ_DEFS"'
	def med(f): map(f) | median | if . == null then null else (. * 100 | round) / 100 end;
	($runs | group_by([.apis, .consumers]) | sort_by(.[0].apis) | map({
		apis: .[0].apis, consumers: .[0].consumers, rounds: length,
		streams_per_s: med(.streams_per_s), first_chunk_p50_ms: med(.first_chunk_p50_ms),
		first_chunk_p99_ms: med(.first_chunk_p99_ms),
		cpu_ms_per_stream: {api: med(.cpu_ms_per_stream.api), consumer: med(.cpu_ms_per_stream.consumer),
		                    redis: med(.cpu_ms_per_stream.redis), balancer: med(.cpu_ms_per_stream.balancer),
		                    simllm: med(.cpu_ms_per_stream.simllm)},
		spublish_per_s_per_node: med(.spublish_per_s_per_node | max),
		commands_per_s_per_node: med(.commands_per_s_per_node | max),
		lost: (map(.lost) | add), loads: map(.load)})) as $shapes
	| {scenario: "scale",
	   settings: {clients: $c, streams: $n, worker_slots: $w, rounds: $rounds, cluster_primaries: 3, queue_shards: 3,
	              sim_first_token_ms: $ft, sim_token_ms: $ti, sim_tokens: $tok},
	   shapes: $shapes,
	   scaling: ($shapes[0].streams_per_s as $base | $shapes | map({shape: "\(.apis),\(.consumers)",
		streams_per_s, vs_first: (.streams_per_s / $base * 100 | round / 100), linear: (.apis / $shapes[0].apis)})),
	   runs: $runs,
	   outcome: {lost: ($runs | map(.lost) | add)}}' >"$RESULTS/scale.json"

jq -r '.shapes[] | "scale: \(.apis) api x \(.consumers) consumer: \(.streams_per_s) streams/s, first chunk p50 \(.first_chunk_p50_ms) ms p99 \(.first_chunk_p99_ms) ms, cpu ms/stream api \(.cpu_ms_per_stream.api) consumer \(.cpu_ms_per_stream.consumer) redis \(.cpu_ms_per_stream.redis), busiest node \(.commands_per_s_per_node) commands/s, lost \(.lost)"' \
	"$RESULTS/scale.json" >&2
jq -e '.outcome.lost == 0 and all(.runs[]; (.paths | keys) == ["queued"])' "$RESULTS/scale.json" >/dev/null ||
	die "scale: streams lost or not queued (see $RESULTS/scale.json)"
