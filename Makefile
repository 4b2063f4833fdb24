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

.PHONY: all build plugins generate run test tarballs sboms image release test-faults soak scale deps vet bench fuzz clean deb rpm packages test-packages man screenshots

all: build

build: plugins
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/fleetgate

# The shipped adapter plugins (plugins/README.md), one executable each.
# Built like the packaged binary (build/pkg/<arch>): static
# (CGO_ENABLED=0), -trimpath.
ADAPTERS := udpline lorawan modbus
plugins:
	@mkdir -p bin/plugins
	for a in $(ADAPTERS); do CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/plugins/$$a ./plugins/$$a || exit 1; done

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
# chromium (the admin page's browser tests, cmd/fleetgate e2e_page_test.go);
# skopeo (reads the OCI archive of `make image` in its tests), podman and
# runc (the release test runs the image), qemu-user (the release test runs
# each arch's binary: qemu-aarch64, qemu-arm, qemu-riscv64).
DEPS := redis-server:redis-server redis-cli:redis-server chromium:chromium \
	skopeo:skopeo podman:podman runc:runc qemu-aarch64:qemu-user qemu-arm:qemu-user qemu-riscv64:qemu-user \
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
	@: "a release ships armv7: the tests must compile where int is 32 bits"
	GOARCH=arm GOARM=7 $(GO) vet $(PKGS)

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
# keeps the gateways at that level throughout (the same plan);
# SOAK_MONITOR=regexp (with SOAK_DUMP) writes the Redis commands that match it,
# scripts' included, and those that lose state to dir/monitor.log.
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

# --- Packages (systemd/nfpm.yaml): dist/fleetgate_<version>_<debian arch>.deb
# and dist/fleetgate-<version>-1.<rpm arch>.rpm for every arch in ARCHS:
# amd64, arm64, armv7 (GOARCH=arm GOARM=7; Debian armhf, rpm armv7hl) and
# riscv64. nfpm is a tool pinned in go.mod (`go tool nfpm`). The package
# version comes from the newest v* tag (v1.2.3 -> 1.2.3, +N.gHASH past
# it), else 0.0.0+git<commit date>.<hash>; .dirty appended for
# uncommitted changes.
ARCHS       ?= amd64 arm64 armv7 riscv64
DIST        ?= dist
NFPM        ?= $(GO) tool nfpm
ifndef PKG_VERSION
PKG_VERSION := $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null | sed -e 's/^v//' -e 's/-\([0-9]*\)-g/+\1.g/'); \
	[ -n "$$v" ] || v=0.0.0+git$$(git log -1 --format=%cd --date=format:%Y%m%d 2>/dev/null).$$(git rev-parse --short HEAD 2>/dev/null); \
	git diff --quiet HEAD 2>/dev/null || v=$$v.dirty; echo $$v)
endif
# An arch's names for Go, Debian and nfpm.
goarch   = $(if $(filter armv7,$1),arm,$1)
goarm    = $(if $(filter armv7,$1),7)
debarch  = $(if $(filter armv7,$1),armhf,$1)
nfpmarch = $(if $(filter armv7,$1),arm7,$1)
comma   := ,
space   := $(subst ,, )
# The date of every file in the packages, tarballs and image, and the
# build date stamped in the binaries: SOURCE_DATE_EPOCH, else the commit's.
REL_EPOCH := $(or $(SOURCE_DATE_EPOCH),$(shell git log -1 --format=%ct 2>/dev/null))
REL_DATE  := $(shell date -u -d @$(REL_EPOCH) +%Y-%m-%dT%H:%M:%SZ)

# build/pkg/<arch>: the binary and the adapters (static, stripped,
# -trimpath, no build ID, stamped with PKG_VERSION, the commit and
# REL_DATE: the same tree gives the same bytes), the man page, the shell
# completions (of the host's build: they are the same on every arch), the
# Debian changelog and the copyright file: systemd/copyright, then the
# licenses of the Go modules that the binary and the adapters compile in
# for <arch>, from the module cache (internal/copyright).
PKG_GOENV = CGO_ENABLED=0 GOOS=linux GOARCH=$(call goarch,$*) GOARM=$(call goarm,$*) GOFLAGS=-buildvcs=false
PKG_BUILD = $(GO) build -trimpath \
	-ldflags "-s -w -buildid= -X main.version=$(PKG_VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(REL_DATE)"
build/pkg/%: FORCE
	rm -rf $@ && mkdir -p $@/plugins
	$(PKG_GOENV) $(PKG_BUILD) -o $@/fleetgate ./cmd/fleetgate
	for a in $(ADAPTERS); do $(PKG_GOENV) $(PKG_BUILD) -o $@/plugins/$$a ./plugins/$$a || exit 1; done
	printf 'fleetgate (%s) unstable; urgency=medium\n\n  * Built from git %s.\n\n -- fleetgate maintainers <fleetgate@example.org>  %s\n' \
	  "$(PKG_VERSION)" "$$(git rev-parse --short HEAD)" "$$(date -R -d @$$(git log -1 --format=%ct))" | gzip -9n > $@/changelog.gz
	$(GO) run ./internal/copyright -header systemd/copyright -o $@/copyright -env '$(PKG_GOENV)' \
	  ./cmd/fleetgate $(ADAPTERS:%=./plugins/%)
	gzip -9n < docs/man/fleetgate.1 > $@/fleetgate.1.gz
	$(GO) run ./cmd/fleetgate completion bash > $@/completion.bash
	$(GO) run ./cmd/fleetgate completion zsh > $@/completion.zsh

deb: $(ARCHS:%=build/pkg/%)
	mkdir -p $(DIST)
	$(foreach a,$(ARCHS),SOURCE_DATE_EPOCH=$(REL_EPOCH) ARCH=$(call nfpmarch,$a) VERSION=$(PKG_VERSION) STAGE=build/pkg/$a \
	  $(NFPM) package -f systemd/nfpm.yaml -p deb -t $(DIST)/fleetgate_$(PKG_VERSION)_$(call debarch,$a).deb &&) true

rpm: $(ARCHS:%=build/pkg/%)
	mkdir -p $(DIST)
	$(foreach a,$(ARCHS),SOURCE_DATE_EPOCH=$(REL_EPOCH) ARCH=$(call nfpmarch,$a) VERSION=$(PKG_VERSION) STAGE=build/pkg/$a \
	  $(NFPM) package -f systemd/nfpm.yaml -p rpm -t $(DIST)/ &&) true

packages: deb rpm

# dist/fleetgate_<version>_linux_<arch>.tar.gz for every arch in ARCHS:
# fleetgate_<version>_linux_<arch>/ holding the binary, plugins/ (the
# adapters), examples/ (the configurations), systemd/ (the units, the
# sysusers file), docs/ (the guides, the man page, the completions, the
# dashboard, the alert rules), README.md, CHANGELOG.md, LICENSE and
# copyright (the licenses of the modules compiled in). Sorted entries,
# numeric root owners, every date REL_EPOCH, gzip without a time stamp.
TAR_DOCS := docs/operations.md docs/security.md docs/events.md docs/bridge.md docs/design.md
tarballs: $(ARCHS:%=build/pkg/%)
	mkdir -p $(DIST)
	for a in $(ARCHS); do n=fleetgate_$(PKG_VERSION)_linux_$$a; d=build/tar/$$n; \
	  rm -rf $$d && install -d -m 0755 $$d $$d/plugins $$d/examples $$d/systemd $$d/docs/grafana $$d/docs/prometheus $$d/docs/plugins && \
	  install -m 0755 build/pkg/$$a/fleetgate $$d/ && install -m 0755 build/pkg/$$a/plugins/* $$d/plugins/ && \
	  install -m 0644 configs/fleetgate.yaml configs/dev.yaml systemd/etc/devices.yaml $$d/examples/ && \
	  install -m 0644 systemd/fleetgate.service systemd/fleetgate-runner.service systemd/fleetgate.sysusers $$d/systemd/ && \
	  install -m 0644 README.md CHANGELOG.md LICENSE build/pkg/$$a/copyright $$d/ && \
	  install -m 0644 $(TAR_DOCS) docs/man/fleetgate.1 build/pkg/$$a/completion.bash build/pkg/$$a/completion.zsh $$d/docs/ && \
	  install -m 0644 plugins/README.md $$d/docs/plugins/ && \
	  install -m 0644 docs/grafana/fleetgate.json $$d/docs/grafana/ && install -m 0644 docs/prometheus/alerts.yml $$d/docs/prometheus/ && \
	  tar --sort=name --format=gnu --mtime=@$(REL_EPOCH) --owner=0 --group=0 --numeric-owner -C build/tar -cf - $$n | \
	    gzip -9n > $(DIST)/$$n.tar.gz || exit 1; done

# dist/fleetgate_<version>_linux_<arch>.cdx.json for every arch in ARCHS:
# a CycloneDX SBOM of the modules compiled into that arch's binary and
# adapters, as their build information records them (cyclonedx-gomod,
# pinned in go.mod, merged by internal/sbom).
sboms: $(ARCHS:%=build/pkg/%)
	mkdir -p $(DIST)
	$(foreach a,$(ARCHS),$(GO) run ./internal/sbom -version $(PKG_VERSION) -epoch $(REL_EPOCH) \
	  -o $(DIST)/fleetgate_$(PKG_VERSION)_linux_$a.cdx.json build/pkg/$a/fleetgate $(ADAPTERS:%=build/pkg/$a/plugins/%) &&) true

# The container image (container/Containerfile) for IMAGE_ARCHS, as an
# OCI archive: dist/fleetgate_<version>_oci.tar (load or push it with
# `skopeo copy oci-archive:...`, docs/operations.md). The build context:
# build/pkg/<arch> and build/image (passwd, group, and the CA
# certificates of golang.org/x/crypto/x509roots/fallback at the version
# go.mod pins, written by internal/cabundle: not the build host's). Its
# tag is the version, with a build's "+" as "_" (a container tag has no
# "+").
IMAGE_ARCHS ?= amd64 arm64 armv7
image: $(IMAGE_ARCHS:%=build/pkg/%)
	rm -rf build/image && install -d -m 0755 build/image/rootfs/etc/ssl/certs build/image/state && \
	  install -d -m 1777 build/image/rootfs/tmp && install -d -m 0755 build/image/rootfs/var/lib && \
	  chmod 0750 build/image/state && \
	  install -m 0644 container/passwd container/group build/image/rootfs/etc/ && \
	  $(GO) run ./internal/cabundle -o build/image/rootfs/etc/ssl/certs/ca-certificates.crt
	mkdir -p $(DIST)
	$(GO) run ./internal/ociimage -f container/Containerfile -context . -epoch $(REL_EPOCH) -tag $(subst +,_,$(PKG_VERSION)) \
	  -platform $(subst $(space),$(comma),$(foreach a,$(IMAGE_ARCHS),linux/$(if $(filter armv7,$a),arm/v7,$a))) \
	  -arg VERSION=$(PKG_VERSION) -arg REVISION=$(COMMIT) -arg CREATED=$(REL_DATE) -o $(DIST)/fleetgate_$(PKG_VERSION)_oci.tar

# `make release VERSION=x.y.z`, from a tree without uncommitted changes
# (the binaries name the commit): into an empty dist/, the tarballs, the
# packages and the SBOMs of every arch in ARCHS, the image, the release
# notes (the section of CHANGELOG.md for that version:
# dist/fleetgate_<version>_notes.md) and SHA256SUMS over all of them.
# Reproducible: the same commit, Go and SOURCE_DATE_EPOCH give the same
# bytes (TestPackageRelease in `make test-packages` builds the whole
# release twice, in two clones at two paths, and compares SHA256SUMS:
# every arch, the image and the SBOMs; `make test` runs only TestReleaseRefuses and the image
# builder's own reproducibility test).
release:
	@echo '$(VERSION)' | grep -Eq '^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$' || \
	  { echo "make release: VERSION=$(VERSION) is not x.y.z[-pre]" >&2; exit 2; }
	rm -rf $(DIST) && mkdir -p $(DIST)
	awk -v v='$(VERSION)' '/^## / { p = ($$2 == v) } p' CHANGELOG.md > $(DIST)/fleetgate_$(VERSION)_notes.md
	@test -s $(DIST)/fleetgate_$(VERSION)_notes.md || \
	  { echo "make release: CHANGELOG.md has no section '## $(VERSION)': write the release notes first" >&2; exit 2; }
	@test -z "$$(git status --porcelain 2>&1)" || \
	  { echo "make release: the tree has changes that are not committed: the release would not be the commit it names" >&2; exit 2; }
	$(MAKE) --no-print-directory PKG_VERSION=$(VERSION) DIST=$(DIST) COMMIT=$(COMMIT) SOURCE_DATE_EPOCH=$(REL_EPOCH) \
	  tarballs packages image sboms
	cd $(DIST) && sha256sum $$(ls | grep -v '^SHA256SUMS$$' | LC_ALL=C sort) > SHA256SUMS

# The package tests (build, inspect, lintian; install, upgrade with an
# edited conffile, remove and purge in an overlay of this machine's root
# and in a minbase root made once by debootstrap and cached in
# build/rootfs), the release test (TestPackageRelease: make release from
# a clone of HEAD, every artifact checked, each arch's binary run under
# qemu-user, the image's binary run in its unpacked root, the whole
# release built again in another clone and compared byte for byte) and the previous release's gateway next to this one on one
# Redis (TestPackageUpgradeSideBySide): about half an hour on 2 cores,
# so not in `make test`, which runs only the release's refusals.
test-packages: deps
	$(GO) test -count=1 -tags packages -timeout 60m -run Package -v ./systemd

.PHONY: FORCE
FORCE:
