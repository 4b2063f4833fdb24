# fleetgate — see README.md. `make run` and `make test` are the two set-up commands.
GO      ?= go
BIN     := bin/fleetgate
PKGS    := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The build date of `fleetgate version`; SOURCE_DATE_EPOCH (reproducible
# builds) wins over the clock.
BUILD_DATE ?= $(shell date -u -d @$${SOURCE_DATE_EPOCH:-$$(date +%s)} +%Y-%m-%dT%H:%M:%SZ)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.buildDate=$(BUILD_DATE) -X main.commit=$(COMMIT)

.PHONY: all build plugins generate run test test-faults soak scale deps vet bench fuzz clean deb rpm packages test-packages man screenshots

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

# What the tests need, as command:Debian package (a,b:package: either
# command will do): redis-server and redis-cli; the real device clients of
# the end-to-end tests (mosquitto_pub, coap-client, which Debian's
# libcoap3-bin names coap-client-notls); mosquitto and mosquitto_passwd
# (the broker of the events publisher's tests); protoc (the plugins/proto
# staleness test); for systemd/ and test-packages systemd-analyze and
# systemd-sysusers, promtool, lintian, rpm, dpkg-deb, debootstrap, chroot;
# for the consumers of docs/events.md curl, node, and Debian's python3 with
# paho-mqtt (paho: checked as an import of /usr/bin/python3) and mqtt.js
# (mqttjs: Debian's node-mqtt, checked as a require);
# bash and zsh (the completion scripts' tests), groff (the man page's);
# chromium (the admin page's browser tests, cmd/fleetgate e2e_page_test.go).
DEPS := redis-server:redis-server redis-cli:redis-server chromium:chromium \
	bash:bash zsh:zsh groff:groff-base \
	mosquitto_pub:mosquitto-clients mosquitto_sub:mosquitto-clients \
	coap-client,coap-client-notls:libcoap3-bin \
	mosquitto:mosquitto mosquitto_passwd:mosquitto protoc:protobuf-compiler \
	systemd-analyze:systemd systemd-sysusers:systemd promtool:prometheus \
	lintian:lintian rpm:rpm dpkg-deb:dpkg-dev debootstrap:debootstrap chroot:coreutils \
	curl:curl node:nodejs paho:python3-paho-mqtt mqttjs:node-mqtt

# Installs the packages of the DEPS that are missing, as root, with one
# apt-get call; as another user it names them and fails. mosquitto lives
# in /usr/sbin, which a user's PATH may lack (internal/mosquittotest looks
# there). The test, fuzz, bench and package targets run it first.
deps:
	@missing() { m=""; for t in $(DEPS); do found=""; \
	    for c in $$(echo "$${t%%:*}" | tr , ' '); do \
	      { command -v $$c || { [ $$c = mosquitto ] && [ -x /usr/sbin/mosquitto ]; } || \
	        { [ $$c = paho ] && /usr/bin/python3 -c 'import paho.mqtt.client'; } || \
	        { [ $$c = mqttjs ] && NODE_PATH=/usr/share/nodejs node -e 'require("mqtt")'; }; } >/dev/null 2>&1 && found=1; done; \
	    [ -n "$$found" ] || case " $$m " in *" $${t#*:} "*) ;; *) m="$$m $${t#*:}";; esac; done; echo "$$m"; }; \
	m=$$(missing); [ -z "$$m" ] && exit 0; \
	echo "installing$$m"; \
	if [ "$$(id -u)" != 0 ]; then echo "missing:$$m: run 'sudo apt-get install -y --no-install-recommends$$m'" >&2; exit 1; fi; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  -o DPkg::Lock::Timeout=600 $$m >/dev/null || exit 1; \
	: "only promtool is wanted: stop the server the package may have started (:9090)"; \
	case "$$m" in *prometheus*) \
	  if [ -d /run/systemd/system ]; then systemctl disable --now prometheus.service >/dev/null 2>&1 || true; \
	  else service prometheus stop >/dev/null 2>&1 || true; fi;; esac; \
	: "redis-server's package starts a system redis on :6379: the tests never use it"; \
	m=$$(missing); [ -z "$$m" ] || { echo "still missing after apt-get:$$m" >&2; exit 1; }

vet:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }
	$(GO) vet $(PKGS)

# Vets and runs the whole suite with -race.
test: deps vet
	$(GO) test -race -count=1 -timeout 14m $(PKGS)

# Writes docs/man/fleetgate.1 from the commands' help; `make test`
# (TestManPageCurrent) fails while it differs.
man:
	$(GO) test ./cmd/fleetgate -count=1 -run '^TestManPageCurrent$$' -args -update-man

# Writes docs/screenshots/*.png (the admin page at 1280 and 360 px) from
# the browser test against a simulated fleet.
screenshots: deps
	$(GO) test ./cmd/fleetgate -count=1 -run '^TestPageInBrowser$$' -args -update-screenshots

# Runs every fuzz target for FUZZTIME each (their seed corpora in
# testdata/fuzz already run as ordinary tests in `make test`); new
# crashers land in testdata/fuzz of their package.
FUZZTIME ?= 30s
fuzz: deps
	@set -e; for pkg in $$(git grep -l '^func Fuzz' -- '*_test.go' | xargs -n1 dirname | sort -u); do \
	  for f in $$(git grep -h -o '^func Fuzz[A-Za-z0-9_]*' -- "$$pkg/*_test.go" | sed 's/^func //'); do \
	    echo "fuzz ./$$pkg $$f ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./$$pkg; \
	  done; \
	done

# The fault suite (package faults, build tag `faults`, so that
# `make test` does not run it): real redis-server processes, two fleetgate
# binaries and a CoAP + MQTT fleet under Redis pauses, restarts, failovers,
# partitions, kills and a simulated reboot; about 3 minutes on 2 cores,
# figures in the -v output (docs/reliability.md). Without -race: the
# scenarios time real processes. One scenario alone:
#   go test -tags faults -count=1 -v -run TestRedisFlushAll ./faults/
test-faults: deps
	$(GO) vet -tags faults ./faults/
	$(GO) test -tags faults -count=1 -parallel 2 -timeout 15m -v ./faults/

# The randomized fault soak (faults/soak_test.go, build tags faults and
# soak; neither `make test` nor `make test-faults` runs it): gateways
# running the runner on Redis (a primary with a replica, or a Cluster), a
# churning CoAP + MQTT fleet, and a nemesis running a schedule of faults
# drawn from SEED, checked in windows and at the end (docs/reliability.md).
# A failing run prints its seed and the line that replays it. TOPOLOGY
# (standalone|cluster), GATEWAYS (2|3) and DEVICES override the draw;
# SOAK_DUMP=dir keeps the event log and the gateways' logs; SOAK_LOG_LEVEL=debug
# keeps the gateways at that level throughout (the same plan).
#   make soak DURATION=30m SEED=42
DURATION ?= 30m
SEED     ?= $(shell date +%s)
TOPOLOGY ?=
GATEWAYS ?=
DEVICES  ?= 120
# go test's -timeout: DURATION + 10m, in seconds.
SOAK_TIMEOUT = $(shell echo '$(DURATION)' | awk '{ s = 0; d = $$0; \
	while (match(d, /^[0-9.]+(h|ms|m|s)/)) { u = substr(d, 1, RLENGTH); d = substr(d, RLENGTH + 1); \
	  n = u + 0; sub(/^[0-9.]+/, "", u); s += n * (u == "h" ? 3600 : u == "m" ? 60 : u == "s" ? 1 : 0.001) } \
	printf "%ds", s + 600 }')
soak: deps
	$(GO) vet -tags 'faults soak' ./faults/
	SOAK_SEED=$(SEED) SOAK_DURATION=$(DURATION) SOAK_TOPOLOGY=$(TOPOLOGY) SOAK_GATEWAYS=$(GATEWAYS) SOAK_DEVICES=$(DEVICES) \
	  $(GO) test -tags 'faults soak' -count=1 -run '^TestSoak$$' -timeout $(SOAK_TIMEOUT) -v ./faults/

# The scale run of docs/benchmarks.md (not in CI; about 12 minutes, and it
# needs the whole machine): one gateway on one Redis, 100,000 CoAP devices
# (10 % over DTLS) and 10,000 MQTT devices from `fleetgate simulate`, freeze
# and leave churn, the gateway restarted at minute 5.
scale: deps
	sim/scale.sh run

# Benchmarks with their ceilings measured in the same run; figures go to
# docs/benchmarks.md. go test runs the packages' benchmarks one package at a
# time, each benchmark once (1x); -timeout bounds each package (cmd/fleetgate
# takes about 15 minutes: 2 × 160 s of CommandsPerMessage, 90 s of
# SimulateSideBySide, about 8 minutes of the data path's BenchmarkBridge*). BenchmarkSimulateSideBySide writes its table between
# the side-by-side markers of $(BENCH_DOC) (BENCH_DOC= : nowhere).
BENCH_DOC ?= docs/benchmarks.md
bench: deps
	BENCH_DOC=$(BENCH_DOC) $(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m $(PKGS)

clean:
	rm -rf bin .run build dist

# --- Packages (systemd/nfpm.yaml): dist/fleetgate_<version>_<arch>.deb and
# dist/fleetgate-<version>-1.<arch>.rpm for every arch in ARCHS. nfpm runs
# as a pinned Go module, outside go.mod. The package version comes from the
# newest v* tag (v1.2.3 -> 1.2.3, +N.gHASH past it), else
# 0.0.0+git<commit date>.<hash>; .dirty appended for uncommitted changes.
ARCHS       ?= amd64 arm64
DIST        ?= dist
NFPM        ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
HOSTARCH    := $(shell $(GO) env GOARCH)
PLUGINS     ?= bin/plugins
ifndef PKG_VERSION
PKG_VERSION := $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null | sed -e 's/^v//' -e 's/-\([0-9]*\)-g/+\1.g/'); \
	[ -n "$$v" ] || v=0.0.0+git$$(git log -1 --format=%cd --date=format:%Y%m%d 2>/dev/null).$$(git rev-parse --short HEAD 2>/dev/null); \
	git diff --quiet HEAD 2>/dev/null || v=$$v.dirty; echo $$v)
endif

# build/pkg/<arch>: the binary (static, stripped), the adapters ($(PLUGINS)/*
# from `make plugins` for the host arch, $(PLUGINS)-<arch>/* for another),
# the man page, the shell completions (of the host's build: they are the
# same on every arch), the Debian changelog and the copyright file:
# systemd/copyright, then the
# licenses of the Go modules that the binary and the adapters compile in
# for <arch>, from the module cache (internal/copyright).
PKG_GOENV = CGO_ENABLED=0 GOOS=linux GOARCH=$*
build/pkg/%: FORCE
	rm -rf $@ && mkdir -p $@/plugins
	$(PKG_GOENV) $(GO) build -trimpath -buildmode=pie -ldflags "-X main.version=$(PKG_VERSION) -s -w" -o $@/fleetgate ./cmd/fleetgate
	for d in $(if $(filter $*,$(HOSTARCH)),$(PLUGINS)) $(PLUGINS)-$*; do \
	  [ -d $$d ] && find $$d -maxdepth 1 -type f -exec cp {} $@/plugins/ \; ; done; true
	printf 'fleetgate (%s) unstable; urgency=medium\n\n  * Built from git %s.\n\n -- fleetgate maintainers <fleetgate@example.org>  %s\n' \
	  "$(PKG_VERSION)" "$$(git rev-parse --short HEAD)" "$$(date -R -d @$$(git log -1 --format=%ct))" | gzip -9n > $@/changelog.gz
	$(GO) run ./internal/copyright -header systemd/copyright -o $@/copyright -env '$(PKG_GOENV)' \
	  ./cmd/fleetgate $(ADAPTERS:%=./plugins/%)
	gzip -9n < docs/man/fleetgate.1 > $@/fleetgate.1.gz
	$(GO) run ./cmd/fleetgate completion bash > $@/completion.bash
	$(GO) run ./cmd/fleetgate completion zsh > $@/completion.zsh

deb: $(ARCHS:%=build/pkg/%)
	mkdir -p $(DIST)
	for a in $(ARCHS); do \
	  ARCH=$$a VERSION=$(PKG_VERSION) STAGE=build/pkg/$$a $(NFPM) package -f systemd/nfpm.yaml -p deb -t $(DIST)/fleetgate_$(PKG_VERSION)_$$a.deb || exit 1; done

rpm: $(ARCHS:%=build/pkg/%)
	mkdir -p $(DIST)
	for a in $(ARCHS); do \
	  ARCH=$$a VERSION=$(PKG_VERSION) STAGE=build/pkg/$$a $(NFPM) package -f systemd/nfpm.yaml -p rpm -t $(DIST)/ || exit 1; done

packages: deb rpm

# The package tests (build, inspect, lintian; install, upgrade with an
# edited conffile, remove and purge in an overlay of this machine's root
# and in a minbase root made once by debootstrap and cached in
# build/rootfs): minutes, so not in `make test`.
test-packages: deps
	$(GO) test -count=1 -tags packages -timeout 20m -run Package -v ./systemd

.PHONY: FORCE
FORCE:
