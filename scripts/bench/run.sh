#!/usr/bin/env bash
# run.sh: the benchmark scenarios behind `make bench`.
#
# Builds the binaries once into bin/, then runs each scenario script on
# loopback with its own redis-server, simllm, api and consumers, which it
# stops by PID when done (or interrupted). Results land in
# bench-results/<UTC date-time>/ (RESULTS overrides): machine.json, one JSON
# per scenario, the raw load tool results and process logs beneath, and
# summary.json / summary.txt with the goals of issue "make bench" checked.
#
#   scripts/bench/run.sh                  # every scenario, ~7-8 minutes
#   SCENARIOS="direct flood" scripts/bench/run.sh
#   BENCH_PROFILE=1 scripts/bench/run.sh  # also save pprof CPU/heap profiles
#
# Exit status: 0 when every scenario ran and lost nothing; goals missed are
# reported, not failed, since they depend on the machine.
source "$(dirname "$0")/lib.sh"
export RESULTS BIN BENCH_PROFILE
require_tools go jq curl redis-server redis-cli ss timeout

SCENARIOS=${SCENARIOS:-direct queued waiting flood noisy}

log "building into $BIN"
(cd "$ROOT" && go build -o "$BIN/" ./cmd/... ./scripts/bench/passproxy)
machine_json >"$RESULTS/machine.json"
git -C "$ROOT" status --porcelain >"$RESULTS/git-status.txt" 2>/dev/null || true
log "results in $RESULTS; machine: $(jq -c . "$RESULTS/machine.json")"

failed=()
for s in $SCENARIOS; do
	log "=== scenario $s (load $(loadavg))"
	t0=$SECONDS
	if ! "$BENCH_DIR/$s.sh"; then
		failed+=("$s")
		log "scenario $s FAILED"
	fi
	log "=== scenario $s took $((SECONDS - t0))s"
done

# Summary: the issue's goals, each met or missed and by how much.
files=()
for s in direct queued waiting flood noisy; do [[ -f $RESULTS/$s.json ]] && files+=("$RESULTS/$s.json"); done
jq -s --slurpfile m "$RESULTS/machine.json" --arg failed "${failed[*]}" '
	(map({key: .scenario, value: .}) | from_entries) as $s
	| def goal(name; value; limit; unit):
		{goal: name, value: value, limit: limit, unit: unit,
		 met: (if value == null then null else value <= limit end),
		 by: (if value == null or value <= limit then null else ((value - limit) * 1000 | round / 1000) end)};
	{machine: $m[0], failed_scenarios: ($failed | split(" ") | map(select(. != ""))),
	 goals: [
		(if $s.direct then
			goal("direct added time to first chunk p50 at 200 concurrent"; $s.direct.c200.median.added_p50; 0.3; "ms"),
			goal("direct added time to first chunk p99 at 200 concurrent"; $s.direct.c200.median.added_p99; 2; "ms"),
			goal("(not default) direct, POOL_BACKEND=local, added p50 at 200 concurrent"; $s.direct.c200_local_pool.median.added_p50; 0.3; "ms"),
			goal("(not default) direct, POOL_BACKEND=local, added p99 at 200 concurrent"; $s.direct.c200_local_pool.median.added_p99; 2; "ms"),
			goal("direct added time to first chunk p50 at 1 concurrent"; $s.direct.c1.median.added_p50; 0.3; "ms"),
			goal("direct added time to first chunk p99 at 1 concurrent"; $s.direct.c1.median.added_p99; 2; "ms")
		 else empty end),
		(if $s.queued then
			goal("queued added time to first chunk p50 at 1 concurrent"; $s.queued.c1.median.added_p50; 3; "ms"),
			goal("queued added time to first chunk p99 at 1 concurrent"; $s.queued.c1.median.added_p99; 15; "ms"),
			goal("queued added time to first chunk p50 at 200 concurrent"; $s.queued.c200.median.added_p50; 3; "ms"),
			goal("queued added time to first chunk p99 at 200 concurrent"; $s.queued.c200.median.added_p99; 15; "ms"),
			goal("(not default) queued, QUEUE_FAILOVER_CHUNK_BATCH_SIZE=1, added p50 at 1 concurrent"; $s.queued.c1_b1.median.added_p50; 3; "ms"),
			goal("(not default) queued, QUEUE_FAILOVER_CHUNK_BATCH_SIZE=1, added p99 at 1 concurrent"; $s.queued.c1_b1.median.added_p99; 15; "ms"),
			goal("(not default) queued, QUEUE_FAILOVER_CHUNK_BATCH_SIZE=1, added p50 at 200 concurrent"; $s.queued.c200_b1.median.added_p50; 3; "ms"),
			goal("(not default) queued, QUEUE_FAILOVER_CHUNK_BATCH_SIZE=1, added p99 at 200 concurrent"; $s.queued.c200_b1.median.added_p99; 15; "ms")
		 else empty end),
		(if $s.noisy then
			goal("noisy neighbour: others first chunk p99 under a 10x flood minus alone"; ($s.noisy.others_under_flood.first_chunk_p99_ms - $s.noisy.others_baseline.first_chunk_p99_ms); 100; "ms")
		 else empty end),
		(if $s.waiting then goal("RSS per waiting stream at \($s.waiting.settings.streams)"; $s.waiting.kib_per_stream; 64; "KiB") else empty end),
		goal("lost streams, every scenario";
			([$s.direct.c1.lost, $s.direct.c200.lost, $s.direct.c1_local_pool.lost, $s.direct.c200_local_pool.lost, $s.queued.c1.lost, $s.queued.c200.lost, $s.queued.c1_b1.lost,
			  $s.queued.c200_b1.lost, ($s.queued.throughput // {} | [.[].lost] | add),
			  $s.waiting.outcome.lost, $s.flood.outcome.lost, $s.noisy.outcome.lost] | map(select(. != null)) | add); 0; "streams")
	 ],
	 scenarios: $s}' "${files[@]}" >"$RESULTS/summary.json"

jq -r '"machine: \(.machine.cpu), \(.machine.nproc) cores, \(.machine.memory), kernel \(.machine.kernel), \(.machine.go), commit \(.machine.commit) (+\(.machine.uncommitted_files) uncommitted files), \(.machine.date), load at start \(.machine.load_at_start)",
	(.goals[] | "\(if .met == true then "MET   " elif .met == false then "MISSED" else "n/a   " end) \(.goal): \(.value) \(.unit) (goal ≤ \(.limit))\(if .by then ", over by \(.by) \(.unit)" else "" end)"),
	(if (.failed_scenarios | length) > 0 then "FAILED scenarios: \(.failed_scenarios | join(", "))" else empty end)' \
	"$RESULTS/summary.json" | tee "$RESULTS/summary.txt"
log "results in $RESULTS"
((${#failed[@]} == 0))
