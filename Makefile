GO      ?= go
BIN     := bin/syncd
PKGS    := ./...
# RACE is -race for syncd's Go code, and not for SQLite: modernc.org/sqlite/lib
# (with the libc and allocator under it) is SQLite's C translated to Go, which
# a cgo build would never instrument either. Left out, a store test takes a
# ninth of the CPU (TestApplyAdvisories_Lifecycle 0.8 s instead of 7.7 s);
# the driver (modernc.org/sqlite), database/sql and all of syncd's code stay
# instrumented, and a race in them is still reported.
RACE    := -race -gcflags='modernc.org/sqlite/lib=-race=false' -gcflags='modernc.org/libc/...=-race=false' -gcflags='modernc.org/memory=-race=false'

.PHONY: build run test test-short cluster-test bench bench-quick soak lint fmt clean

## build: compile syncd into bin/syncd
build:
	$(GO) build -o $(BIN) ./cmd/syncd

## run: syncd on its embedded defaults (simulator, embedded NATS on 127.0.0.1:4222, ./data/syncd.db)
run: build
	./$(BIN) run --demo

## test: vet, then every test with the race detector (fuzz targets run their seed corpus)
test:
	$(GO) vet $(PKGS)
	$(GO) test $(RACE) -count=1 -timeout 9m $(PKGS)

## cluster-test: two syncd replicas and a follower against a three-node JetStream cluster while NATS nodes and the leader die, signing, under the permissions of deploy/nats-permissions.conf; then the leader paused, the leader black-holed, the stream leader's node partitioned, 200 ms of latency, and the stream lost whole (about three minutes; docs/cluster.md)
cluster-test:
	SYNCD_TEST_CLUSTER=1 $(GO) test $(RACE) -count=1 -timeout 12m \
		-run '^TestCluster_(ThreeNodes|LeaderPaused|LeaderBlackHoled|StreamLeaderNodePartitioned|SlowNetworkNoTakeover|StreamLostWhole)$$' -v ./cmd/syncd/

## bench: syncd against the limits of the machine and the API, at full size; one table, and bench/results.json (docs/performance.md)
bench:
	$(GO) test -run '^$$' -bench '^BenchmarkSyncd$$' -benchtime 1x -count 1 -timeout 30m ./bench/

## bench-quick: the same at a tenth of the size (bench/results-quick.json)
bench-quick:
	BENCH_SCALE=0.1 $(GO) test -run '^$$' -bench '^BenchmarkSyncd$$' -benchtime 1x -count 1 -timeout 5m ./bench/

## soak: 10 minutes of continuous change, upstream faults, SIGKILLs and a 20s NATS outage, checked every minute
soak:
	SOAK_DURATION=10m SOAK_TRIALS=20 SOAK_NATS_OUTAGE=20s $(GO) test -count=1 -timeout 30m -run 'Soak|Reliability' -v ./cmd/syncd/ 2>&1 | grep -E '^(---|===|ok|FAIL|PASS)|figures|check|killed|survived|NATS|changes'

## lint: gofmt, go vet and staticcheck must be clean, and no line over 120 characters (golangci-lint's lll, .golangci.yml)
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0 run $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
