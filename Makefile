# fleetgate — see README.md. `make run` and `make test` are the two set-up commands.
GO      ?= go
BIN     := bin/fleetgate
PKGS    := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: all build run test deps vet bench fuzz clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/fleetgate

# Runs the gateway with the shipped development config: embedded store,
# anonymous CoAP devices on loopback, runner on, state in ./.run.
run: build
	mkdir -p .run
	FLEETGATE_GATEWAY_STATE_DIR=$(CURDIR)/.run ./$(BIN) run -c configs/dev.yaml

# Installs what the tests need and is missing (redis-server and redis-cli,
# mosquitto and mosquitto_passwd, as root through apt-get), then vets and
# runs the whole suite with -race.
deps:
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || { \
	  echo "installing redis-server (tests start their own servers on loopback)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "redis-server missing: run 'sudo apt-get install -y redis-server'" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@# the Debian package starts a system redis on :6379; tests never use it
	@command -v redis-server >/dev/null
	@# mosquitto (the broker of the events publisher's tests) lives in /usr/sbin
	@PATH="$$PATH:/usr/sbin" command -v mosquitto >/dev/null 2>&1 && command -v mosquitto_passwd >/dev/null 2>&1 || { \
	  echo "installing mosquitto (tests start their own brokers on loopback)"; \
	  if [ "$$(id -u)" != 0 ]; then echo "mosquitto missing: run 'sudo apt-get install -y mosquitto'" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null; }

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
