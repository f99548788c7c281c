# hiloop's two set-up commands, and a few more.
#   make run    build what is missing, start a local cluster (a real gVisor node where the machine can run one), serve against it
#   make test   the whole test suite, real local cluster included
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
TEST_TIMEOUT ?= 45m

.PHONY: run test cluster build bench bench-spread vet fuzz fuzz-short soak chart image

# FUZZ lists the fuzz targets as package:target.
FUZZ := ./api:FuzzExtractTar ./server:FuzzBodies ./server:FuzzQuery ./server:FuzzFrames ./server:FuzzSSHKey ./server:FuzzPreviewVisit ./receipt:FuzzParseReceipt ./control:FuzzParseListing

# cluster builds the pinned control-plane binaries into the cache (only the
# missing ones) and prints their directory.
cluster:
	@testdata/cluster/build.sh

# chart writes the chart's renderings that are checked in: deploy/hiloop.yaml
# (the default values, for kubectl apply), the local cluster's boundary
# (values-local.yaml), and the boundary's templates at the default values,
# which hiloop's self-check holds a cluster to unless --boundary-file says
# otherwise (the ConfigMap hiloop-boundary holds the same for an install).
# TestRenderingsMatchChart keeps them in sync.
BOUNDARY_TEMPLATES := namespaces runtimeclass admission networkpolicy quota
chart:
	@helm=$$(testdata/cluster/build.sh | tail -n1)/helm && \
	  $$helm template hiloop deploy/chart --include-crds > deploy/hiloop.yaml && \
	  $$helm template hiloop deploy/chart -f deploy/chart/values-local.yaml > localcluster/assets/boundary.yaml && \
	  $$helm template hiloop deploy/chart $(foreach t,$(BOUNDARY_TEMPLATES),--show-only templates/$(t).yaml) > boundary/chart-boundary.yaml

# image builds the OCI image of the static binary without a container
# daemon (deploy/image), tagged as the chart's default image, into a tarball
# for docker load, kind load image-archive or ctr import, and prints its
# digest (also in bin/hiloop-image.digest) for the chart's image.digest.
APP_VERSION := $(shell sed -n 's/^appVersion: *"\(.*\)"/\1/p' deploy/chart/Chart.yaml)
IMAGE ?= hiloop/hiloop:$(APP_VERSION)
image: build
	$(GO) run ./deploy/image -binary bin/hiloop -tag $(IMAGE) -o bin/hiloop-image.tar -digest-file bin/hiloop-image.digest

VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o bin/hiloop .

run: build
	@bin=$$(testdata/cluster/build.sh | tail -n1) && HILOOP_CLUSTER_BIN=$$bin ./bin/hiloop dev

test:
	-@testdata/preview-dns.sh
	@bin=$$(testdata/cluster/build.sh | tail -n1) && \
	  HILOOP_CLUSTER_BIN=$$bin $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	@$(MAKE) --no-print-directory fuzz-short

# fuzz-short runs each fuzz target for a few seconds (part of make test);
# fuzz runs each for two minutes, ten in all.
FUZZTIME ?= 4s
fuzz-short:
	@for t in $(FUZZ); do \
	  echo "fuzz $${t#*:} for $(FUZZTIME):"; \
	  out=$$($(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) $${t%%:*} 2>&1); rc=$$?; \
	  if [ $$rc != 0 ]; then \
	    echo "$$out"; echo "fuzz $${t#*:} failed; once more (an input it found is now a seed and fails again):"; \
	    out=$$($(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) $${t%%:*} 2>&1) || { echo "$$out"; exit 1; }; \
	  fi; \
	  echo "$$out" | grep -E '^(fuzz: elapsed: [0-9hms]+, execs|ok)' | tail -n 2; \
	done

fuzz:
	@$(MAKE) --no-print-directory fuzz-short FUZZTIME=2m

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v ^testdata/))" || { gofmt -l .; exit 1; }

# soak kills hiloop serve with SIGKILL KILLS times under load and checks that
# nothing acknowledged is lost (TestCrashSafety).
KILLS ?= 200
soak:
	@bin=$$(testdata/cluster/build.sh | tail -n1) && \
	  HILOOP_CLUSTER_BIN=$$bin HILOOP_CRASH_KILLS=$(KILLS) $(GO) test -count=1 -run '^TestCrashSafety$$' -v -timeout 60m ./e2e | grep -E 'kills survived|^(--- |ok|FAIL)'

# bench-spread runs one benchmark RUNS times (each run against its own
# baseline measured in the same run) and prints every run, the median and
# the range of each figure: make bench-spread BENCH=BenchmarkExecRoundTrip.
BENCH ?= BenchmarkExecRoundTrip
RUNS ?= 5
bench-spread:
	@command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server; }
	@set -o pipefail; bin=$$(testdata/cluster/build.sh | tail -n1) && \
	  HILOOP_CLUSTER_BIN=$$bin $(GO) test -run '^$$' -bench '^($(BENCH))$$' -benchtime 1x -count $(RUNS) -timeout 120m ./e2e | $(GO) run ./internal/benchspread

# bench runs the benchmarks against the local cluster; see docs/benchmarks.md.
# The -L throughput benchmark compares with OpenSSH's sshd (Debian's
# openssh-server), installed here when missing.
bench:
	@command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server; }
	@bin=$$(testdata/cluster/build.sh | tail -n1) && \
	  HILOOP_CLUSTER_BIN=$$bin HILOOP_BENCH_PLOTS=$(CURDIR)/docs $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./...
