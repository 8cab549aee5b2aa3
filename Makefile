GO      ?= go
BIN     := bin/syncd
PKGS    := ./...

.PHONY: build run test test-short bench bench-quick soak lint fmt clean

## build: compile syncd into bin/syncd
build:
	$(GO) build -o $(BIN) ./cmd/syncd

## run: syncd on its embedded defaults (simulator, embedded NATS on 127.0.0.1:4222, ./data/syncd.db)
run: build
	./$(BIN) run --demo

## test: vet, then every test with the race detector (fuzz targets run their seed corpus)
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 9m $(PKGS)

## bench: the benchmarks, at full size
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 15m $(PKGS)

## bench-quick: the benchmarks at a small size
bench-quick:
	BENCH_SCALE=0.1 $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 3m $(PKGS)

## lint: gofmt and go vet must be clean
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
