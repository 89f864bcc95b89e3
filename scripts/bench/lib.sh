# shellcheck shell=bash
# lib.sh: helpers shared by the benchmark scenarios. Source it; it sets
# strict mode, a results directory and an EXIT trap that stops exactly the
# processes started through start_proc (by PID, never by name).
#
# Environment:
#   RESULTS      results directory (default bench-results/<UTC date-time>)
#   BIN          directory of the built binaries (default <repo>/bin)
#   BENCH_PROFILE=1  run api and consumers with -pprof and save CPU/heap
#                profiles and loadtest -cpuprofile files next to the results

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/../.." && pwd)
BIN=${BIN:-$ROOT/bin}
RESULTS=${RESULTS:-$ROOT/bench-results/$(date -u +%Y%m%d-%H%M%S)}
BENCH_PROFILE=${BENCH_PROFILE:-0}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)

PIDS=()       # started processes, oldest first
USED_PORTS=() # ports handed out by free_port in this shell

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	log "FAIL: $*"
	exit 1
}

# loadavg prints the 1, 5 and 15 minute load averages.
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

require_tools() {
	local t
	for t in "$@"; do
		command -v "$t" >/dev/null 2>&1 || die "$t is missing (Debian: apt-get install $t)"
	done
}

# free_port sets PORT to a TCP port nobody uses, below the ephemeral range
# so that no outgoing connection can take it before the server binds it,
# and never one handed out before in this shell. Call it directly, not in
# $(...), or the record of handed-out ports is lost.
free_port() {
	local p i u used lo=20000 eph
	eph=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
	((eph >= 22000)) && lo=$((eph - 12000))
	for ((i = 0; i < 200; i++)); do
		p=$((lo + RANDOM % 12000))
		used=0
		for u in "${USED_PORTS[@]}"; do [[ $u == "$p" ]] && used=1; done
		((used)) && continue
		if [[ -z $(ss -Htan "( sport = :$p )" 2>/dev/null) ]]; then
			USED_PORTS+=("$p")
			PORT=$p
			return 0
		fi
	done
	die "no free port found"
}

# start_proc NAME CMD...: starts CMD in the background with its output in
# $RESULTS/logs/NAME.log and records its PID; the PID is left in REPLY.
# Call it directly, not in $(...), so the PID is recorded in this shell.
start_proc() {
	local name=$1
	shift
	mkdir -p "$RESULTS/logs"
	"$@" >"$RESULTS/logs/$name.log" 2>&1 &
	REPLY=$!
	PIDS+=("$REPLY")
	echo "$REPLY $name" >>"$RESULTS/logs/pids"
	log "started $name (pid $REPLY)"
}

# stop_pid PID [GRACE_SECONDS]: SIGTERM, then SIGKILL after the grace
# period, and reap it. Only for PIDs this shell started.
stop_pid() {
	local pid=$1 grace=${2:-30} i
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < grace * 10; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "pid $pid did not stop within ${grace}s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	wait "$pid" 2>/dev/null || true
	local keep=() p
	for p in "${PIDS[@]}"; do [[ $p != "$pid" ]] && keep+=("$p"); done
	PIDS=("${keep[@]}")
}

# stop_all stops every recorded process, newest first (clients and workers
# before the api, the api before Redis and the upstream).
stop_all() {
	local i
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
		stop_pid "${PIDS[i]}"
	done
}

trap 'stop_all' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_http URL PID [SECONDS]: polls URL until it answers 2xx, failing when
# PID dies or the deadline (default 20s) passes.
wait_http() {
	local url=$1 pid=$2 deadline=$((SECONDS + ${3:-20}))
	until curl -fsS -m 1 -o /dev/null "$url" 2>/dev/null; do
		kill -0 "$pid" 2>/dev/null || die "pid $pid exited before $url answered (see $RESULTS/logs)"
		((SECONDS < deadline)) || die "$url did not answer within ${3:-20}s"
		sleep 0.1
	done
}

# start_redis: a throwaway redis-server on a free loopback port, no
# persistence; sets REDIS_PORT, REDIS_PID and REDIS_URL.
start_redis() {
	free_port
	REDIS_PORT=$PORT
	start_proc "redis-$REDIS_PORT" redis-server --bind 127.0.0.1 --port "$REDIS_PORT" \
		--save '' --appendonly no --protected-mode yes --maxclients 10000 --loglevel warning
	local pid=$REPLY deadline=$((SECONDS + 10))
	REDIS_PID=$pid
	until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do
		kill -0 "$pid" 2>/dev/null || die "redis-server exited (see $RESULTS/logs)"
		((SECONDS < deadline)) || die "redis-server did not answer within 10s"
		sleep 0.1
	done
	REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
}

# start_redis_cluster N: N (at least 3) cluster-enabled redis-servers on
# free loopback ports, no persistence, joined into one Redis Cluster of
# primaries with `redis-cli --cluster create`; waits until every node says
# cluster_state:ok. Sets REDIS_CLUSTER_ADDRS (comma list), CLUSTER_PORTS
# and CLUSTER_PIDS; start_api and start_consumer then use the cluster.
start_redis_cluster() {
	local n=$1 i port bus dir deadline addrs=()
	CLUSTER_PORTS=() CLUSTER_PIDS=()
	for ((i = 0; i < n; i++)); do
		free_port
		port=$PORT
		free_port
		bus=$PORT
		dir="$RESULTS/redis-cluster-$port"
		mkdir -p "$dir"
		start_proc "redis-cluster-$port" redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" \
			--save '' --appendonly no --protected-mode yes --maxclients 10000 --loglevel warning \
			--cluster-enabled yes --cluster-config-file "$dir/nodes.conf" --cluster-port "$bus" \
			--cluster-node-timeout 5000
		CLUSTER_PIDS+=("$REPLY")
		CLUSTER_PORTS+=("$port")
		addrs+=("127.0.0.1:$port")
		deadline=$((SECONDS + 10))
		until redis-cli -p "$port" ping >/dev/null 2>&1; do
			kill -0 "$REPLY" 2>/dev/null || die "redis-server on $port exited (see $RESULTS/logs)"
			((SECONDS < deadline)) || die "redis-server on $port did not answer within 10s"
			sleep 0.1
		done
	done
	redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
		>"$RESULTS/logs/redis-cluster-create.log" 2>&1 || die "redis-cli --cluster create failed (see $RESULTS/logs)"
	for port in "${CLUSTER_PORTS[@]}"; do
		deadline=$((SECONDS + 30))
		until redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; do
			((SECONDS < deadline)) || die "cluster node $port not ok within 30s"
			sleep 0.2
		done
	done
	REDIS_CLUSTER_ADDRS=$(
		IFS=,
		echo "${addrs[*]}"
	)
	log "redis cluster of $n primaries: $REDIS_CLUSTER_ADDRS"
}

# redis_env sets REDIS_ENV to the Redis setting of start_api and
# start_consumer: the cluster once start_redis_cluster ran, else REDIS_URL.
redis_env() {
	if [[ -n ${REDIS_CLUSTER_ADDRS:-} ]]; then
		REDIS_ENV=(REDIS_CLUSTER_ADDRS="$REDIS_CLUSTER_ADDRS")
	else
		REDIS_ENV=(REDIS_URL="$REDIS_URL")
	fi
}

# start_simllm NAME FIRST_TOKEN_MS TOKEN_MS TOKENS: sets SIM_PORT, SIM_PID.
start_simllm() {
	local name=$1
	free_port
	SIM_PORT=$PORT
	start_proc "$name" env SIM_FIRST_TOKEN_MS="$2" SIM_TOKEN_MS="$3" SIM_TOKENS="$4" SIM_SEED=1 \
		"$BIN/simllm" -addr "127.0.0.1:$SIM_PORT"
	SIM_PID=$REPLY
	wait_http "http://127.0.0.1:$SIM_PORT/healthz" "$SIM_PID"
}

# pprof_flag: when profiling, sets PPROF_ADDR to a free loopback address
# and PPROF_FLAGS to (-pprof PPROF_ADDR); else both empty.
pprof_flag() {
	PPROF_ADDR= PPROF_FLAGS=()
	if [[ $BENCH_PROFILE == 1 ]]; then
		free_port
		PPROF_ADDR=127.0.0.1:$PORT
		PPROF_FLAGS=(-pprof "$PPROF_ADDR")
	fi
}

# start_api NAME [VAR=value...]: an api on a free port against Redis and
# the simulated upstream on SIM_PORT (an OpenAI-compatible provider, as in
# production); the extra settings override the defaults below. Sets
# API_PORT, API_PID and, when profiling, PPROF_ADDR. API_BIN, when set,
# is the api binary to run instead of $BIN/api (a baseline build).
start_api() {
	local name=$1
	shift
	free_port
	API_PORT=$PORT
	pprof_flag
	redis_env
	start_proc "$name" env HTTP_ADDR="127.0.0.1:$API_PORT" "${REDIS_ENV[@]}" \
		LLM_PROVIDER=openai LLM_BASE_URL="http://127.0.0.1:${SIM_PORT:-1}/v1" \
		EMBEDDED_WORKERS=false LOG_LEVEL=warn "$@" "${API_BIN:-$BIN/api}" "${PPROF_FLAGS[@]}"
	API_PID=$REPLY
	wait_http "http://127.0.0.1:$API_PORT/readyz" "$API_PID"
}

# start_consumer NAME [VAR=value...]: a consumer as start_api does. Sets
# CONSUMER_PID, CONSUMER_PORT (its /metrics) and, when profiling, PPROF_ADDR.
# CONSUMER_BIN, when set, is the consumer binary to run instead of
# $BIN/consumer (a baseline build).
start_consumer() {
	local name=$1 port
	shift
	free_port
	port=$PORT
	CONSUMER_PORT=$port
	pprof_flag
	redis_env
	start_proc "$name" env CONSUMER_HTTP_ADDR="127.0.0.1:$port" "${REDIS_ENV[@]}" \
		LLM_PROVIDER=openai LLM_BASE_URL="http://127.0.0.1:${SIM_PORT:-1}/v1" \
		LOG_LEVEL=warn "$@" "${CONSUMER_BIN:-$BIN/consumer}" "${PPROF_FLAGS[@]}"
	CONSUMER_PID=$REPLY
	wait_http "http://127.0.0.1:$port/healthz" "$CONSUMER_PID"
}

# rss_kib PID prints the resident set size of PID in KiB.
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# metric URL NAME_WITH_LABELS prints one Prometheus sample's value (0 when
# absent).
metric() {
	curl -fsS -m 5 "$1" 2>/dev/null | awk -v m="$2" '$1 == m {v = $2} END {print v + 0}'
}

declare -A LOAD_PID LOAD_BEFORE LOAD_ARGS LOAD_CPU

# CPU_PID maps a name to the PID of a server process whose CPU time each
# load run records (cpu_seconds in the run's JSON): register processes with
# CPU_PID[name]=$PID.
declare -A CPU_PID=()

# cpu_json prints the CPU seconds each process in CPU_PID has used so far.
cpu_json() {
	local k out='{}'
	for k in "${!CPU_PID[@]}"; do
		[[ -r /proc/${CPU_PID[$k]}/stat ]] || continue
		out=$(jq -c --arg k "$k" --argjson v "$(cpu_seconds "${CPU_PID[$k]}")" '. + {($k): $v}' <<<"$out")
	done
	echo "$out"
}

# load_start NAME SECONDS LOADTEST_ARGS...: starts the load tool in the
# background, bounded by SECONDS (SIGTERM, which makes it stop and report,
# then SIGKILL 15s later); its PID is left in REPLY. load_finish NAME waits
# for it and writes $RESULTS/$SCENARIO/NAME.json: the run's name and
# arguments, load averages before and after, exit code and the tool's JSON
# result. Lost streams (exit 1) do not stop the scenario; they are in the
# result and fail the scenario's check.
load_start() {
	local name=$1 limit=$2
	shift 2
	local dir="$RESULTS/$SCENARIO" prof=()
	mkdir -p "$dir"
	[[ $BENCH_PROFILE == 1 ]] && prof=(-cpuprofile "$dir/$name.loadtest.cpu.pprof")
	LOAD_BEFORE[$name]=$(loadavg)
	LOAD_ARGS[$name]="$*"
	LOAD_CPU[$name]=$(cpu_json)
	timeout -s TERM -k 15 "$limit" "$BIN/loadtest" -json "${prof[@]}" "$@" \
		>"$dir/$name.raw.json" 2>"$dir/$name.log" &
	REPLY=$!
	PIDS+=("$REPLY")
	LOAD_PID[$name]=$REPLY
}

load_finish() {
	local name=$1 dir="$RESULTS/$SCENARIO" code=0 after cpu_after
	wait "${LOAD_PID[$name]}" || code=$?
	local keep=() p
	for p in "${PIDS[@]}"; do [[ $p != "${LOAD_PID[$name]}" ]] && keep+=("$p"); done
	PIDS=("${keep[@]}")
	after=$(loadavg)
	cpu_after=$(cpu_json)
	if ! jq -e . "$dir/$name.raw.json" >/dev/null 2>&1; then
		die "$name: loadtest wrote no result (exit $code, see $dir/$name.log)"
	fi
	jq --arg name "$name" --arg before "${LOAD_BEFORE[$name]}" --arg after "$after" --argjson code "$code" \
		--arg args "${LOAD_ARGS[$name]}" --argjson cb "${LOAD_CPU[$name]}" --argjson ca "$cpu_after" \
		'{run: $name, args: $args, load_before: $before, load_after: $after, exit_code: $code,
		  cpu_seconds: ($ca | with_entries(select($cb[.key] != null) | .value = ((.value - $cb[.key]) * 100 | round / 100))),
		  result: .}' \
		"$dir/$name.raw.json" >"$dir/$name.json"
	rm -f "$dir/$name.raw.json"
	log "$name: exit $code, $(jq -r '.result | "done=\(.done) err=\(.errors) refused=\(.refused) lost=\(.lost) \(.elapsed_seconds * 10 | round / 10)s"' "$dir/$name.json"), load $after"
}

# run_load NAME SECONDS LOADTEST_ARGS...: load_start, then load_finish.
run_load() {
	load_start "$@"
	load_finish "$1"
}

# cpu_seconds PID prints the CPU time (user + system) PID has used.
cpu_seconds() {
	awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f\n", ($14 + $15) / hz}' "/proc/$1/stat"
}

# save_profile URL FILE: fetches a pprof profile in the background; the
# PID of the fetch is left in REPLY (wait for it with wait_pid).
save_profile() {
	start_proc "pprof-$(basename "$2")" curl -fsS -m 120 -o "$2" "$1"
}

# wait_pid PID: waits for a process this shell started to end by itself.
wait_pid() {
	wait "$1" 2>/dev/null || true
	local keep=() p
	for p in "${PIDS[@]}"; do [[ $p != "$1" ]] && keep+=("$p"); done
	PIDS=("${keep[@]}")
}

# jq helpers: median of a number array, and a loadtest path's first-chunk
# percentile from a run file.
JQ_DEFS='def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
def r3: if . == null then null else (. * 1000 | round) / 1000 end;'

# machine_json prints what the results were measured on.
machine_json() {
	local dirty
	if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
		dirty=$(git -C "$ROOT" status --porcelain | wc -l)
	else
		dirty=-1 # not a git checkout (a copied tree): unknown
	fi
	jq -n --arg nproc "$(nproc)" \
		--arg cpu "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)" \
		--arg mem "$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)" \
		--arg kernel "$(uname -r)" --arg go "$(go version 2>/dev/null | awk '{print $3}')" \
		--arg redis "$(redis-server --version | awk '{print $3}')" \
		--arg commit "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
		--argjson dirty "$dirty" --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --arg load "$(loadavg)" \
		'{nproc: ($nproc | tonumber), cpu: $cpu, memory: $mem, kernel: $kernel, go: $go, redis: $redis,
		  commit: $commit, uncommitted_files: $dirty, date: $date, load_at_start: $load}'
}

# pair_summary FILES...: summarizes interleaved A/B runs of one
# concurrency. Each file is a run_load result named …-p<N>-<label>; A is the
# label given as $A_LABEL, B as $B_LABEL. Prints JSON: per pair the
# first-chunk p50/p99 of A and B (all completed streams) and B−A, and the
# medians over pairs: of A, of B, and of the paired differences (the
# headline "added" figures).
pair_summary() {
	jq -s --arg a "$A_LABEL" --arg b "$B_LABEL" "$JQ_DEFS"'
	def fc: .result.latency.all.first_chunk // {};
	def lbl: .run | capture("-p(?<i>[0-9]+)-(?<l>.*)$");
	def tput: if .result.elapsed_seconds > 0 then .result.done / .result.elapsed_seconds else null end;
	[ group_by(lbl.i)[] | {
		pair: (.[0] | lbl.i | tonumber),
		a: (map(select(lbl.l == $a))[0]), b: (map(select(lbl.l == $b))[0]) } ]
	| map({pair,
		a: {p50: (.a | fc.p50_ms), p99: (.a | fc.p99_ms), total_p50: .a.result.latency.all.total.p50_ms,
		    streams_per_s: (.a | tput), done: .a.result.done, lost: .a.result.lost, paths: .a.result.paths, load: .a.load_before,
		    cpu_seconds: .a.cpu_seconds},
		b: {p50: (.b | fc.p50_ms), p99: (.b | fc.p99_ms), total_p50: .b.result.latency.all.total.p50_ms,
		    streams_per_s: (.b | tput), done: .b.result.done, lost: .b.result.lost, paths: .b.result.paths, load: .b.load_before,
		    cpu_seconds: .b.cpu_seconds}})
	| map(. + {added_p50: ((.b.p50 - .a.p50) | r3), added_p99: ((.b.p99 - .a.p99) | r3)})
	| map(.a.cpu_us_per_stream = (if .a.done > 0 then ([.a.cpu_seconds[]] | add) * 1e6 / .a.done | round else null end)
	    | .b.cpu_us_per_stream = (if .b.done > 0 then ([.b.cpu_seconds[]] | add) * 1e6 / .b.done | round else null end)) as $pairs
	| {a: $a, b: $b, pairs: $pairs,
	   median: {a_p50: ($pairs | map(.a.p50) | median | r3), a_p99: ($pairs | map(.a.p99) | median | r3),
	            b_p50: ($pairs | map(.b.p50) | median | r3), b_p99: ($pairs | map(.b.p99) | median | r3),
	            added_p50: ($pairs | map(.added_p50) | median | r3), added_p99: ($pairs | map(.added_p99) | median | r3),
	            a_streams_per_s: ($pairs | map(.a.streams_per_s) | median | r3),
	            b_streams_per_s: ($pairs | map(.b.streams_per_s) | median | r3),
	            a_cpu_us_per_stream: ($pairs | map(.a.cpu_us_per_stream) | median),
	            b_cpu_us_per_stream: ($pairs | map(.b.cpu_us_per_stream) | median)},
	   lost: ($pairs | map(.a.lost + .b.lost) | add),
	   loads: ($pairs | map(.a.load, .b.load))}' "$@"
}

# start_proxy NAME UPSTREAM_URL: the bare pass-through hop (passproxy) in
# front of UPSTREAM_URL, the floor the api is measured against. Sets
# PROXY_PORT and PROXY_PID.
start_proxy() {
	local name=$1
	free_port
	PROXY_PORT=$PORT
	start_proc "$name" "$BIN/passproxy" -addr "127.0.0.1:$PROXY_PORT" -upstream "$2"
	PROXY_PID=$REPLY
	wait_http "http://127.0.0.1:$PROXY_PORT/healthz" "$PROXY_PID"
}
