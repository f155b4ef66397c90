# agentgate — make targets. `make` alone builds; `make help` lists every target.
GO       ?= go
BIN      := bin/agentgate
PKG      ?= ./...
FUZZ     ?= FuzzKey
PROTOC_GEN_GO_VERSION := v1.36.12
# Benchmarks timed per operation (default -benchtime), and benchmarks whose b.Loop iteration is
# a whole round of a same-run comparison (docs/BENCHMARKS.md); ROUNDS rounds each.
BENCH_PER_OP := Key|SessionTurn|HTTPIngress|CommitTurns|FencedCommit|ExclusiveCommit|LoadSession|ClusterDeliver
BENCH_ROUNDS := PersistenceActor|RawBatchSize|SingleTurnLatency|Pipeline|RoutingKeys|IdleSessionHeap|KnownVsActiveSessions|MetricsOverhead
ROUNDS   ?= 3
# Every fuzz target, as name:package; make help lists them.
FUZZ_TARGETS := FuzzKey:./internal/identity FuzzNeutraliseName:./internal/identity \
	FuzzLoad:./internal/config FuzzParseCommand:./actors FuzzSplit:./platforms/discord \
	FuzzThreadName:./platforms/discord FuzzInboundMessage:./platforms/discord \
	FuzzHTTPAPI:./supervisor FuzzDecodeOps:./persistence/spool FuzzSpoolNext:./persistence/spool \
	FuzzSpoolReplay:./persistence FuzzModelAnswer:./agents/openai FuzzCommandOutput:./agents/exec \
	FuzzContextOverflow:./agents/openai FuzzStringHead:./agents/openai FuzzStrip:./internal/ansi

.DEFAULT_GOAL := build
.PHONY: build run test test-short bench fuzz lint check cover tidy generate clean help

# The binary carries its checkout's commit (agentgate version) also where GOFLAGS holds
# -buildvcs=false, as some machines set it: a -buildvcs flag on the command line wins. Where git
# cannot read the tree (no checkout, no git, or a checkout another user owns, which git refuses
# and -buildvcs=auto then fails the build on), nothing is stamped and the build goes on.
BUILDVCS ?= $(shell git status --porcelain >/dev/null 2>&1 && echo auto || echo false)

build: ## build bin/agentgate
	$(GO) build -buildvcs=$(BUILDVCS) -o $(BIN) ./cmd/agentgate

run: build ## run the daemon on its embedded default (SQLite in ./data, HTTP on 127.0.0.1:8080, echo agent)
	./$(BIN) serve

# go test's default bound of 10 minutes per package binary is for a hang, not for a slow machine:
# the actors package once took more than 10 under -race on a loaded 2-core machine.
test: ## run every test with the race detector (includes the binary end-to-end tests), then the cluster tests without it
	$(GO) test -race -count=1 -shuffle=on -timeout 25m ./...
	@# protoactor's cluster code is not race-clean: the multi-member tests (//go:build !race) run without -race
	$(GO) test -count=1 -shuffle=on -run '^TestCluster' ./supervisor ./cmd/agentgate

test-short: ## run the fast tests only
	$(GO) test -race -short ./...

bench: build ## run the benchmarks and agentgate bench (~4 min on 2 cores), then list the targets' verdicts (also in bench.out); ROUNDS=8 for a goal check
	@{ $(GO) test -run='^$$' -bench='^Benchmark($(BENCH_PER_OP))$$' -benchmem ./... && \
	  $(GO) test -run='^$$' -bench='^Benchmark($(BENCH_ROUNDS))$$' -benchtime=$(ROUNDS)x ./... && \
	  ./$(BIN) bench --sessions 100 --messages 50 --rounds $(ROUNDS) && \
	  ./$(BIN) bench --sessions 1000 --messages 10 --rounds $(ROUNDS); echo $$? > bench.status; } 2>&1 | tee bench.out
	@echo; echo "== targets (issue #9), medians of this run's $(ROUNDS) rounds (1 is a smoke test; 5 or more a check):"; grep -o 'target .*: \(met\|MISSED by .*\)$$' bench.out
	@exit $$(cat bench.status)

fuzz: ## fuzz one target for 30s: make fuzz FUZZ=FuzzKey PKG=./internal/identity
	$(GO) test -run='^$$' -fuzz=$(FUZZ) -fuzztime=30s $(PKG)

lint: ## gofmt (must print nothing), go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

check: lint test ## what CI runs: lint and test

cover: ## test with coverage, writes cover.out
	$(GO) test -race -count=1 -coverprofile=cover.out ./...
	$(GO) tool cover -func=cover.out | tail -1

tidy: ## fail if go.mod/go.sum are not tidy
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

generate: ## regenerate protobuf code (needs Debian's protobuf-compiler)
	@command -v protoc >/dev/null || { echo "protoc missing: apt-get install -y protobuf-compiler"; exit 1; }
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc --go_out=. --go_opt=paths=source_relative actors/messages.proto

clean: ## remove build output (never ./data)
	rm -rf bin cover.out bench.out bench.status

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'
	@echo "fuzz targets (make fuzz FUZZ=<name> PKG=<package>):"
	@for t in $(FUZZ_TARGETS); do printf '  %-19s %s\n' "$${t%%:*}" "$${t#*:}"; done
