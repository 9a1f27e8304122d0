GO ?= go

.PHONY: test vet lint fmt bench bench-nginx bench-proxy build demo release

# The test command: formatting, vet, and every test under the race detector.
# One package at a time (-p 1): several tests hold real-time bounds (Redis
# timeouts, load steps over loopback) that a 2-core machine cannot keep
# while another package saturates it.
# The library (module github.com/sluice-go/sluice) and the tools (module
# github.com/sluice-go/sluice/cmd: the CLI, demo and simulator) are tested in
# one run through the workspace (go.work), and so is the gRPC module
# (github.com/sluice-go/sluice/grpcgate: interceptors, Envoy RLS, ext_authz),
# and the raw gRPC client of the rate limit service load generator
# (bench/rlsload).
test: fmt vet lint
	$(GO) test -race -count=1 -p 1 ./... ./cmd/... ./grpcgate/... ./bench/rlsload/... ./bench/rlsfloor/...

vet:
	$(GO) vet ./... ./cmd/... ./bench/... ./grpcgate/...

# staticcheck, pinned: it finds what vet does not (an ignored write error in
# the proxy's WebSocket path, shadowed and unused values).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	$(GO) run $(STATICCHECK) ./... ./cmd/... ./grpcgate/... ./bench/...

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The binary, stamped with its version from the VCS (sluice version): the
# toolchain derives a pseudo-version and the revision from the checkout
# (-buildvcs=auto also when GOFLAGS turns it off; nothing stamped outside a
# checkout).
build:
	$(GO) build -buildvcs=auto -o bin/sluice ./cmd/sluice

# Release artifacts in dist/ (docs/install.md): static binaries for linux and
# darwin on amd64 and arm64, each stamped with the checkout's version,
# SHA256SUMS over them, a CycloneDX SBOM of each read from the binary's own
# build information (the modules it links, nothing else), and, where a
# container builder runs, an OCI image archive built from the Dockerfile.
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
CYCLONEDX ?= github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0
release:
	@rm -rf dist && mkdir -p dist
	@set -e; for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=dist/sluice-$$os-$$arch; \
		echo "make release: $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=auto -ldflags="-s -w" -o $$out ./cmd/sluice; \
		$(GO) run $(CYCLONEDX) bin -json -output $$out.cdx.json $$out 2>/dev/null; \
	done
	@cd dist && sha256sum sluice-*-* > SHA256SUMS && cat SHA256SUMS
	@host=dist/sluice-$$($(GO) env GOOS)-$$($(GO) env GOARCH); if [ -x $$host ]; then echo "make release: $$host version"; $$host version; fi
	@if docker info >/dev/null 2>&1 && docker buildx version >/dev/null 2>&1; then \
		echo "make release: OCI image (docker buildx) -> dist/sluice-oci.tar"; \
		docker buildx build --output type=oci,dest=dist/sluice-oci.tar . ; \
	elif command -v podman >/dev/null && podman info >/dev/null 2>&1; then \
		echo "make release: OCI image (podman) -> dist/sluice-oci.tar"; \
		podman build --format oci -t sluice:release . && podman save --format oci-archive -o dist/sluice-oci.tar sluice:release; \
	else \
		echo "make release: no OCI image: no container builder runs here (docker with a running engine and buildx, or podman)"; \
	fi

# Peer comparisons in one run; see BENCHMARKS.md.
bench:
	cd bench && $(GO) test -run '^$$' -bench . -count 10 -cpu 1,2 | $(GO) run ./ratio \
		TokenBucketAllow/ClockRead GCRAAllow/ClockRead \
		XTimeRateAllow/TokenBucketAllow XTimeRateAllow/GCRAAllow \
		KeyedTake1/TokenBucketTake KeyedTake1K/KeyedTake1 KeyedTake1MZipf/KeyedTake1 KeyedTake1M/KeyedTake1 \
		KeyedTake1MZipf/TokenBucketTake KeyedTake1M/TokenBucketTake KeyedTake1M/DRAMLatency \
		KeyedTakeParallel-2/KeyedTakeParallel \
		RedisRate/RedisSluice RedisSluiceNoBatch/RedisSluice RedisSluiceScriptGoRedis/RedisSluiceNoBatch RedisSluice/RedisLease RedisSluice/RedisLeaseSlots
	$(GO) test -run '^$$' -bench . -count 10 ./internal/httpcore ./proxy | (cd bench && $(GO) run ./ratio \
		Rejected/AdmittedNoopHTTP Rejected/AdmittedNoop RejectedMetrics/Rejected ThroughProxy/Direct)
	$(GO) test -run '^$$' -bench Chain -count 10 . | (cd bench && $(GO) run ./ratio \
		'Chain/gates=1|ChainStoreCall' 'Chain/gates=3|ChainStoreCall' 'Chain/gates=6|ChainStoreCall')
	$(GO) test -run '^$$' -bench MercuryStep -count 10 ./cmd/internal/sim
	$(GO) test -run '^$$' -bench . -count 10 ./grpcgate/... | (cd bench && $(GO) run ./ratio \
		LoopbackAdmitted/LoopbackBare LoopbackAdmittedNoMetadata/LoopbackBare LoopbackRejected/LoopbackBareError \
		LoopbackRejectedNoDetails/LoopbackBareError UnaryRejected/UnaryAdmitted)

# nginx alone, nginx + sluice serve (auth_request) and sluice proxy in front
# of one no-op application, wrk on loopback (Debian's nginx and wrk); see
# BENCHMARKS.md.
bench-nginx:
	SLUICE_BENCH_NGINX=1 $(GO) test -run '^TestNginxThroughput$$' -count=1 -v ./serve

# sluice proxy, Go's httputil.ReverseProxy alone and nginx (when installed)
# in front of one upstream, wrk and an open-loop generator, interleaved
# rounds, with the ratios of issue 20's acceptance; see BENCHMARKS.md.
bench-proxy:
	cd bench && $(GO) run ./proxyload -rounds 5 -duration 5s

# The main job: goodput under open-loop overload, with and without sluice.
# With empty caches most of the time goes to fetching modules and compiling,
# so both steps print progress (a line every 20 modules fetched and every 25
# packages compiled) instead of minutes of silence; any other line (an
# error) is printed as it comes.
# $(call PROGRESS,what,every,counted,ignored): count lines matching counted,
# drop those matching ignored, print the rest; exit with the command's code.
PROGRESS = awk -v what="$(1)" -v every=$(2) '/^exit [0-9]+$$/ {rc = $$2; next} $(3) {n++; if (n % every == 0) print "  ... " n " " what; next} $(4) {next} {print} END {if (n) print "  " n " " what; exit rc}'
demo:
	@echo "make demo: fetching modules (with empty caches 10-20 s)..."
	@# Only the modules the binary is built from (about 40; go mod download would fetch the whole
	@# workspace's graph, 146, and add their checksums to go.work.sum, so that a fresh clone's
	@# binary called itself dirty).
	@{ $(GO) list -x -deps ./cmd/sluice 2>&1 >/dev/null; echo "exit $$?"; } | $(call PROGRESS,modules fetched,10,/^go: downloading /,/^# get /)
	@echo "make demo: compiling (with empty caches about 1 minute on 2 cores)..."
	@{ $(GO) build -buildvcs=auto -v -o bin/sluice ./cmd/sluice 2>&1; echo "exit $$?"; } | $(call PROGRESS,packages compiled,25,/^[A-Za-z0-9._~/-]+$$/,0)
	./bin/sluice demo --json sluice-demo.json --plot sluice-demo
