#!/usr/bin/env bash
# poolceiling.sh: new streams per second through one pool primary (issue
# 31, goal 6), read off the Go benchmark BenchmarkStreamsPerSecond
# (internal/pool/redispool): acquire + release per stream, direct and
# queued, on one redis-server ("single") and on a 3-primary Redis Cluster
# ("cluster3"), each reporting streams/s among its metrics.
#
# POOL_CEILING_FILE, when set, is that benchmark's saved `go test -bench`
# output, read instead of running it. Else the benchmark runs here when
# the tree has it (POOL_BENCHTIME per case, 2s, POOL_COUNT times, 3; it starts its own
# redis-servers on loopback and stops them); a tree without it writes
# {"available": false} and the summary says n/a.
#
# Writes $RESULTS/poolceiling/bench.txt and $RESULTS/poolceiling.json:
# per case (deploy, mode) every metric the benchmark reported, by unit,
# and the median streams/s of each case over its repetitions.
source "$(dirname "$0")/lib.sh"
SCENARIO=poolceiling
require_tools go jq
dir="$RESULTS/$SCENARIO"
mkdir -p "$dir"
POOL_BENCHTIME=${POOL_BENCHTIME:-2s}
POOL_COUNT=${POOL_COUNT:-3}

if [[ -n ${POOL_CEILING_FILE:-} ]]; then
	[[ -r $POOL_CEILING_FILE ]] || die "POOL_CEILING_FILE $POOL_CEILING_FILE is not readable"
	cp "$POOL_CEILING_FILE" "$dir/bench.txt"
elif grep -qs '^func BenchmarkStreamsPerSecond(' "$ROOT"/internal/pool/redispool/*_test.go; then
	log "poolceiling: go test -bench BenchmarkStreamsPerSecond -benchtime $POOL_BENCHTIME -count $POOL_COUNT"
	(cd "$ROOT" && timeout -s TERM -k 15 600 go test -run '^$' -bench '^BenchmarkStreamsPerSecond$' \
		-benchtime "$POOL_BENCHTIME" -count "$POOL_COUNT" ./internal/pool/redispool/) >"$dir/bench.txt" 2>&1 ||
		die "poolceiling: the benchmark failed (see $dir/bench.txt)"
else
	log "poolceiling: this tree has no BenchmarkStreamsPerSecond; nothing to read"
	echo '{"scenario": "poolceiling", "available": false}' >"$RESULTS/poolceiling.json"
	exit 0
fi

# "BenchmarkStreamsPerSecond/single/direct-2  N  v1 unit1  v2 unit2 …";
# a client library's log line printed while the case runs can split the
# name from its figures, which then start a later line.
awk 'function emit(name, from,    n, part, i, s2) {
		sub(/-[0-9]+$/, "", name); n = split(name, part, "/")
		printf "%s{\"deploy\": \"%s\", \"mode\": \"%s\", \"iterations\": %s, \"metrics\": {", sep, part[2], (n > 2 ? part[3] : ""), $from
		s2 = ""
		for (i = from + 1; i < NF; i += 2) { printf "%s\"%s\": %s", s2, $(i + 1), $i; s2 = ", " }
		printf "}}"; sep = ",\n"}
	$1 ~ /^BenchmarkStreamsPerSecond\// {
		if ($2 ~ /^[0-9]+$/ && $0 ~ /ns\/op/) { emit($1, 2); pending = "" } else pending = $1
		next}
	pending != "" && $1 ~ /^[0-9]+$/ && $0 ~ /ns\/op/ { emit(pending, 1); pending = "" }
	BEGIN {print "["} END {print "]"}' "$dir/bench.txt" |
	jq "$JQ_DEFS"'{scenario: "poolceiling", available: (length > 0), cases: .,
	     streams_per_s: (group_by(.deploy, .mode) | map({key: "\(.[0].deploy)/\(.[0].mode)", value: (map(.metrics["streams/s"]) | median | r3)}) | from_entries)}' \
		>"$RESULTS/poolceiling.json"
jq -r '.streams_per_s | to_entries[] | "poolceiling \(.key): \(.value) new streams/s"' "$RESULTS/poolceiling.json" >&2
