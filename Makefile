# fleetgate — see README.md. `make run` and `make test` are the two set-up commands.
GO      ?= go
BIN     := bin/fleetgate
PKGS    := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: all build plugins generate run test deps vet bench fuzz clean

all: build

build: plugins
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/fleetgate

# The shipped adapter plugins (plugins/README.md), one executable each.
ADAPTERS := udpline lorawan modbus
plugins:
	@mkdir -p bin/plugins
	for a in $(ADAPTERS); do $(GO) build -ldflags "$(LDFLAGS)" -o bin/plugins/$$a ./plugins/$$a || exit 1; done

# Regenerates plugins/proto from adapter.proto with protoc and the
# generators pinned as tools in go.mod (a test fails when it is stale).
generate:
	cd plugins/proto && protoc -I . \
	  --plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
	  --plugin=protoc-gen-go-grpc="$$($(GO) tool -n protoc-gen-go-grpc)" \
	  --go_out=. --go_opt=paths=source_relative \
	  --go-grpc_out=. --go-grpc_opt=paths=source_relative adapter.proto

# Runs the gateway with the shipped development config: embedded store,
# anonymous CoAP devices on loopback, runner on, state in ./.run.
run: build
	mkdir -p .run
	FLEETGATE_GATEWAY_STATE_DIR=$(CURDIR)/.run ./$(BIN) run -c configs/dev.yaml

# Installs what the tests need and is missing (redis-server and redis-cli,
# as root through apt-get), then vets and runs the whole suite with -race.
deps:
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || { \
	  echo "installing redis-server (tests start their own servers on loopback)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "redis-server missing: run 'sudo apt-get install -y redis-server'" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@# the Debian package starts a system redis on :6379; tests never use it
	@command -v redis-server >/dev/null
	@command -v protoc >/dev/null 2>&1 || { \
	  echo "installing protobuf-compiler (the plugins/proto staleness test runs protoc)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "protoc missing: run 'sudo apt-get install -y protobuf-compiler'" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null; }

vet:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }
	$(GO) vet $(PKGS)

test: deps vet
	$(GO) test -race -count=1 -timeout 14m $(PKGS)

# Benchmarks with their ceilings measured in the same run; figures go to
# docs/benchmarks.md.
bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m $(PKGS)

clean:
	rm -rf bin .run
