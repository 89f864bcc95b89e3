#!/usr/bin/env bash
# deadcode.sh: fails when a function of the module is unreachable from
# every binary (cmd/...), as golang.org/x/tools/cmd/deadcode finds it, so
# dead code stays removed. Test kits (internal/testkit/...) serve tests
# only and are not reported. A method only an interface requires and no
# caller reaches is listed in ALLOWED with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."

# KafkaCarrier.Keys: propagation.TextMapCarrier requires it; the W3C
# propagator only calls Get and Set. config.DefaultValues: docscheck
# holds docs/OPERATIONS.md and configs/spillway.yaml to the defaults
# through it.
ALLOWED='^internal/telemetry/propagation\.go:[0-9]+:[0-9]+: unreachable func: KafkaCarrier\.Keys$|^internal/config/defaults\.go:[0-9]+:[0-9]+: unreachable func: DefaultValues$'

out=$(${GO:-go} tool deadcode ./cmd/... | grep -v '^internal/testkit/' | grep -Ev "$ALLOWED" || true)
if [ -n "$out" ]; then
	echo "unreachable from every binary (delete it, or move a test-only helper into a _test.go file or internal/testkit):" >&2
	echo "$out" >&2
	exit 1
fi
