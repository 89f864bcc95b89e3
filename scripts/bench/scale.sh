#!/usr/bin/env bash
# scale.sh: N api processes behind a load balancer and M consumers on a
# 3-primary Redis Cluster, for (N,M) in SCALE_SHAPES ("1,1 2,2 4,4").
#
# One Redis Cluster (start_redis_cluster 3) and one simllm serve every
# shape; each shape and round has its own QUEUE_PREFIX, so nothing carries
# over. Per shape: N apis with DIRECT_PATH_ENABLED=false (every stream
# queued), QUEUE_SHARDS=3 and the Redis pool (CONNECTION_POOL_SIZE=1000, so
# the provider is not the limit); M consumers whose WORKER_CONCURRENCY adds
# up to SCALE_WORKERS (256), so worker slots are never short and do not
# grow with M; `loadtest -balance` in front of the apis (least
# connections, streamed, as nginx in configs/nginx.conf). Through the
# balancer, after a warm-up of 500 streams:
#   light      SCALE_LIGHT_C (20) clients, SCALE_LIGHT_N (600) streams:
#              time to first chunk when nothing saturates;
#   saturated  SCALE_C (200) clients streaming again at once, SCALE_N (3000)
#              streams: streams/s the shape serves, first chunk under that
#              load, CPU seconds of every process (summed per tier) per
#              stream, and per cluster node the Redis commands of the run
#              (INFO commandstats before and after; SPUBLISH calls are the
#              result messages per shard).
# The shapes run in turn SCALE_ROUNDS (2) times; a shape's figures are
# medians over its rounds. Part 2, the cost of a chunk: shape (1,1)
# saturated again (SCALE_LONG_N, 1000 streams) with answers of
# SCALE_LONG_TOKENS (256) chunks; the difference from the 16-chunk runs,
# per chunk, separates what a chunk costs from what a stream costs (the projection in docs/BENCHMARKS.md uses
# both). After each saturated run, MEMORY USAGE of a sample of its stream
# logs (up to 70 per node) tells what one log keeps in Redis.
#
# Writes $RESULTS/scale/*.json and $RESULTS/scale.json. Environment:
# SCALE_SHAPES, SCALE_C, SCALE_N, SCALE_LIGHT_C, SCALE_LIGHT_N,
# SCALE_WORKERS, SCALE_ROUNDS, SCALE_LONG_TOKENS, SCALE_LONG_N, SIM_* (50/5/16).
source "$(dirname "$0")/lib.sh"
SCENARIO=scale
require_tools jq curl redis-server redis-cli ss

SCALE_SHAPES=${SCALE_SHAPES:-1,1 2,2 4,4}
SCALE_C=${SCALE_C:-200}
SCALE_N=${SCALE_N:-3000}
SCALE_LIGHT_C=${SCALE_LIGHT_C:-20}
SCALE_LIGHT_N=${SCALE_LIGHT_N:-600}
SCALE_WORKERS=${SCALE_WORKERS:-256}
SCALE_ROUNDS=${SCALE_ROUNDS:-2}
SCALE_LONG_TOKENS=${SCALE_LONG_TOKENS:-256}
SCALE_LONG_N=${SCALE_LONG_N:-1000}
FT=${SIM_FIRST_TOKEN_MS:-50} TI=${SIM_TOKEN_MS:-5} TOK=${SIM_TOKENS:-16}

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
dir="$RESULTS/scale"
mkdir -p "$dir"
start_redis_cluster 3
start_simllm simllm "$FT" "$TI" "$TOK"
SIM_SHORT_PORT=$SIM_PORT SIM_SHORT_PID=$SIM_PID
start_simllm simllm-long "$FT" "$TI" "$SCALE_LONG_TOKENS"
SIM_LONG_PORT=$SIM_PORT SIM_LONG_PID=$SIM_PID

# commandstats PORT: the node's calls per command, as a JSON object.
commandstats() {
	redis-cli -p "$1" info commandstats | tr -d '\r' |
		awk -F'[:=,]' 'BEGIN {printf "{"} /^cmdstat_/ {sub("cmdstat_", "", $1); printf "%s\"%s\":%s", sep, $1, $3; sep=","} END {print "}"}'
}
# log_bytes PREFIX: the mean MEMORY USAGE of up to 70 stream logs per node under
# PREFIX (sampled on every node), in bytes; 0 when none is found.
log_bytes() {
	local port key sum=0 count=0 b
	for port in "${CLUSTER_PORTS[@]}"; do
		while read -r key; do
			[[ -z $key || $key == *:reader ]] && continue
			b=$(redis-cli -p "$port" memory usage "$key" samples 0)
			[[ $b =~ ^[0-9]+$ ]] || continue
			sum=$((sum + b)) count=$((count + 1))
		done < <(redis-cli -p "$port" --scan --pattern "$1log:{*" | head -n 70)
	done
	((count > 0)) && echo $((sum / count)) || echo 0
}
# cluster_stats: {"<port>": {command: calls}} for every node.
cluster_stats() {
	local port out='{}'
	for port in "${CLUSTER_PORTS[@]}"; do
		out=$(jq -c --arg p "$port" --argjson s "$(commandstats "$port")" '. + {($p): $s}' <<<"$out")
	done
	echo "$out"
}

# measure_shape N M RUN TOKENS: starts N apis, M consumers and the
# balancer against the simllm answering TOKENS chunks, runs the warm-up,
# the light run (unless TOKENS differs from SIM_TOKENS) and the saturated
# run named RUN, and stops them.
measure_shape() {
	local n=$1 m=$2 run=$3 tokens=$4 i apis=() started=() before after
	SIM_PORT=$SIM_SHORT_PORT
	CPU_PID=([simllm]=$SIM_SHORT_PID)
	if ((tokens != TOK)); then
		SIM_PORT=$SIM_LONG_PORT
		CPU_PID=([simllm]=$SIM_LONG_PID)
	fi
	# The stream logs outlive the run, for the memory reading after it.
	local settings=(DIRECT_PATH_ENABLED=false QUEUE_PREFIX="$run:" QUEUE_SHARDS=3 POOL_BACKEND=redis
		CONNECTION_POOL_SIZE=1000 CONNECTION_POOL_PER_USER=1000 QUEUE_MAX_PER_IDENTITY=1000
		STREAM_LOG_TTL_SECONDS=7200)
	for ((i = 0; i < ${#CLUSTER_PIDS[@]}; i++)); do CPU_PID[redis_$((i + 1))]=${CLUSTER_PIDS[i]}; done
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
	local lb=127.0.0.1:$PORT
	start_proc "balancer-$run" "$BIN/loadtest" -balance "$lb" -backends "$(
		IFS=,
		echo "${apis[*]}"
	)"
	CPU_PID[balancer]=$REPLY
	started+=("$REPLY")
	wait_http "http://$lb/healthz" "$REPLY"
	local common=(-url "http://$lb/v1/stream" -tokens "$tokens" -seed 1 -prompts 500 -users 200 -timeout 60s)

	log "$run: $n api x $m consumer, $tokens-chunk answers"
	run_load "$run-warmup" 120 "${common[@]}" -c "$SCALE_C" -n 500
	if ((tokens == TOK)); then
		run_load "$run-light" 120 "${common[@]}" -c "$SCALE_LIGHT_C" -n "$SCALE_LIGHT_N"
	fi
	before=$(cluster_stats)
	local streams=$SCALE_N
	((tokens == TOK)) || streams=$SCALE_LONG_N
	run_load "$run" 300 "${common[@]}" -c "$SCALE_C" -n "$streams"
	after=$(cluster_stats)
	jq -n --argjson b "$before" --argjson a "$after" --argjson lb "$(log_bytes "$run:")" \
		'{commands: ($a | with_entries(.key as $k | .value |= with_entries(.value -= ($b[$k][.key] // 0) | select(.value > 0)))),
		  log_bytes: $lb}' \
		>"$dir/$run.redis.json"
	for ((i = ${#started[@]} - 1; i >= 0; i--)); do stop_pid "${started[i]}"; done
}

runs=()
for ((round = 1; round <= SCALE_ROUNDS; round++)); do
	for shape in $SCALE_SHAPES; do
		n=${shape%,*} m=${shape#*,}
		measure_shape "$n" "$m" "n$n-m$m-r$round" "$TOK"
		runs+=("$n $m $round n$n-m$m-r$round")
	done
done
measure_shape 1 1 "n1-m1-long" "$SCALE_LONG_TOKENS"

# --- summary ---
# run_json N M ROUND RUN: one measured run as a JSON object.
run_json() {
	local light=null
	[[ -f $dir/$4-light.json ]] && light=$(cat "$dir/$4-light.json")
	jq -c --argjson n "$1" --argjson m "$2" --argjson round "$3" --argjson light "$light" \
		--slurpfile r "$dir/$4.redis.json" '
		def tier(p): [.cpu_seconds | to_entries[] | select(.key | startswith(p)) | .value] | add;
		def per_stream(p): tier(p) * 1000 / .result.done * 1000 | round / 1000;
		def ms: if . == null then null else . * 10 | round / 10 end;
		{apis: $n, consumers: $m, round: $round, done: .result.done, errors: .result.errors,
		 refused: .result.refused, lost: (.result.lost + ($light.result.lost // 0)), paths: .result.paths,
		 elapsed_s: .result.elapsed_seconds,
		 streams_per_s: (.result.done / .result.elapsed_seconds * 10 | round / 10),
		 first_chunk_p50_ms: (.result.latency.all.first_chunk.p50_ms | ms),
		 first_chunk_p99_ms: (.result.latency.all.first_chunk.p99_ms | ms),
		 light_first_chunk_p50_ms: ($light.result.latency.all.first_chunk.p50_ms | ms),
		 light_first_chunk_p99_ms: ($light.result.latency.all.first_chunk.p99_ms | ms),
		 light_streams_per_s: (if $light == null then null else $light.result.done / $light.result.elapsed_seconds * 10 | round / 10 end),
		 cpu_ms_per_stream: {api: per_stream("api"), consumer: per_stream("consumer"), redis: per_stream("redis"),
		                     balancer: per_stream("balancer"), simllm: per_stream("simllm")},
		 log_bytes_per_stream: $r[0].log_bytes,
		 redis_per_node: ($r[0].commands | map_values({spublish: (.spublish // 0), xadd: (.xadd // 0),
		                     xreadgroup: (.xreadgroup // 0), xack: (.xack // 0),
		                     scripts: ((.evalsha // 0) + (.eval // 0) + (.fcall // 0)), all: ([.[]] | add)})),
		 load: .load_before}
		| . as $o
		| .redis_commands_per_stream = (([$o.redis_per_node[] | .all] | add) / $o.done * 10 | round / 10)
		| .spublish_per_s_per_node = ($o.redis_per_node | [.[] | .spublish / $o.elapsed_s | round])
		| .commands_per_s_per_node = ($o.redis_per_node | [.[] | .all / $o.elapsed_s | round])' "$dir/$4.json"
}
runs_json=$(for r in "${runs[@]}"; do
	# shellcheck disable=SC2086 # four words: N M ROUND RUN
	run_json $r
done | jq -s .)
long_json=$(run_json 1 1 0 n1-m1-long)
jq -n --argjson runs "$runs_json" --argjson long "$long_json" --argjson c "$SCALE_C" --argjson n "$SCALE_N" \
	--argjson lc "$SCALE_LIGHT_C" --argjson ln "$SCALE_LIGHT_N" --argjson w "$SCALE_WORKERS" \
	--argjson rounds "$SCALE_ROUNDS" --argjson ft "$FT" --argjson ti "$TI" --argjson tok "$TOK" \
	--argjson longtok "$SCALE_LONG_TOKENS" "$JQ_DEFS"'
	def med(f): map(f) | median | if . == null then null else (. * 1000 | round) / 1000 end;
	($runs | group_by([.apis, .consumers]) | sort_by(.[0].apis) | map({
		apis: .[0].apis, consumers: .[0].consumers, rounds: length,
		streams_per_s: med(.streams_per_s), first_chunk_p50_ms: med(.first_chunk_p50_ms),
		first_chunk_p99_ms: med(.first_chunk_p99_ms),
		light_first_chunk_p50_ms: med(.light_first_chunk_p50_ms), light_first_chunk_p99_ms: med(.light_first_chunk_p99_ms),
		light_streams_per_s: med(.light_streams_per_s),
		cpu_ms_per_stream: {api: med(.cpu_ms_per_stream.api), consumer: med(.cpu_ms_per_stream.consumer),
		                    redis: med(.cpu_ms_per_stream.redis), balancer: med(.cpu_ms_per_stream.balancer),
		                    simllm: med(.cpu_ms_per_stream.simllm)},
		redis_commands_per_stream: med(.redis_commands_per_stream),
		log_bytes_per_stream: med(.log_bytes_per_stream),
		spublish_per_s_busiest_node: med(.spublish_per_s_per_node | max),
		commands_per_s_busiest_node: med(.commands_per_s_per_node | max),
		lost: (map(.lost) | add), loads: map(.load)})) as $shapes
	| ($shapes[0]) as $base
	| {scenario: "scale",
	   settings: {clients: $c, streams: $n, light_clients: $lc, light_streams: $ln, worker_slots: $w,
	              rounds: $rounds, cluster_primaries: 3, queue_shards: 3,
	              sim_first_token_ms: $ft, sim_token_ms: $ti, sim_tokens: $tok, long_tokens: $longtok},
	   shapes: $shapes,
	   scaling: ($shapes | map({shape: "\(.apis),\(.consumers)", streams_per_s,
		vs_first: (.streams_per_s / $base.streams_per_s * 100 | round / 100), linear: (.apis / $base.apis)})),
	   chunk_cost: {long: $long,
		extra_chunks: ($longtok - $tok),
		cpu_us_per_chunk: ($long.cpu_ms_per_stream as $l | ($runs | map(select(.apis == 1 and .consumers == 1))) as $short
			| {api: (($l.api - ($short | med(.cpu_ms_per_stream.api))) * 1000 / ($longtok - $tok) | round),
			   consumer: (($l.consumer - ($short | med(.cpu_ms_per_stream.consumer))) * 1000 / ($longtok - $tok) | round),
			   redis: (($l.redis - ($short | med(.cpu_ms_per_stream.redis))) * 1000 / ($longtok - $tok) | round)}),
		redis_commands_per_chunk: (($long.redis_commands_per_stream - ($runs | map(select(.apis == 1 and .consumers == 1))
			| med(.redis_commands_per_stream))) / ($longtok - $tok) * 100 | round / 100),
		log_bytes_per_chunk: (($long.log_bytes_per_stream - ($runs | map(select(.apis == 1 and .consumers == 1))
			| med(.log_bytes_per_stream))) / ($longtok - $tok) | round)},
	   runs: $runs,
	   outcome: {lost: (($runs | map(.lost) | add) + $long.lost)}}' >"$RESULTS/scale.json"

jq -r '(.shapes[] | "scale: \(.apis) api x \(.consumers) consumer: \(.streams_per_s) streams/s; first chunk p50/p99 \(.light_first_chunk_p50_ms)/\(.light_first_chunk_p99_ms) ms light, \(.first_chunk_p50_ms)/\(.first_chunk_p99_ms) ms saturated; cpu ms/stream api \(.cpu_ms_per_stream.api) consumer \(.cpu_ms_per_stream.consumer) redis \(.cpu_ms_per_stream.redis); busiest node \(.commands_per_s_busiest_node) commands/s; lost \(.lost)"),
	"scale: per extra chunk: cpu µs api \(.chunk_cost.cpu_us_per_chunk.api) consumer \(.chunk_cost.cpu_us_per_chunk.consumer) redis \(.chunk_cost.cpu_us_per_chunk.redis), \(.chunk_cost.redis_commands_per_chunk) Redis commands, \(.chunk_cost.log_bytes_per_chunk) bytes of stream log"' \
	"$RESULTS/scale.json" >&2
jq -e '.outcome.lost == 0 and all(.runs[], .chunk_cost.long; (.paths | keys) == ["queued"])' "$RESULTS/scale.json" >/dev/null ||
	die "scale: streams lost or not queued (see $RESULTS/scale.json)"
