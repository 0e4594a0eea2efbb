# tokengate — build, test, lint, bench and run the proxy-wasm filter.
#
#   make deps       wasm32-wasip1 target, .venv with Envoy 1.40.0, redis-server + webdis (idempotent)
#   make build      release .wasm: target/wasm32-wasip1/release/tokengate.wasm, and the admin CLI:
#                   target/release/tokengate (`cargo install --path cli` installs it)
#   make cli        the admin CLI alone
#   make test       unit tests (native) + integration tests through real Envoy + `envoy --mode validate` of envoy/
#                   + the CLI's tests (real Redis; `check` against Envoy's own load line; a report vs a run's ledger)
#                   (includes the short fault matrix, wasm-test/tests/faults.rs: ~45 s, 5 phases × 5 s of load)
#                   and the rolling-upgrade test (upgrade.rs, ~65 s) and the deploy/ renderings (deploy.rs, ~80 s)
#   make soak       the fault matrix long: Redis paused/killed/restarted, Webdis killed, Envoy SIGTERM +
#                   restart under load, both quota.on_failure policies, ledger vs Redis counters; prints
#                   the table. SOAK_SECONDS (300) of load over the 5 phases (each fault repeated every 15 s),
#                   SOAK_TENANTS (60 per phase), SOAK_CLIENTS (24), SOAK_RPS (100); the documented bounds are
#                   asserted (also in make test; FAULTS_STRICT=0 only prints the table)
#   make fleet      the long fleet and upgrade tests (~8 min on 2 cores, run one at a time): three Envoys × 2 workers
#                   sharing one Redis and a Redis Cluster (3 masters + 3 replicas behind Envoy's redis_proxy)
#                   under 100 tenants (FLEET_SECS of load per run, default 15), and a Cluster master killed
#                   under load; the previous release (wasm-test/artefacts) and this build side by side, and one
#                   Envoy's listener reloaded old -> new -> old, under load (wasm-test/tests/upgrade.rs);
#                   prints each run's figures (docs/scaling.md). Their short versions are in make test
#   make lint       rustfmt check, clippy -D warnings: native (workspace, all targets) and wasm32-wasip1
#   make bench      estimator accuracy per corpus class (both splits) and speed, body-rewrite speed, then Envoy side by side:
#                   no filter / Envoy's buffer filter / empty wasm / tokengate (req/s, CPU, latency; the leased quota
#                   with 1, 100 and 10,000 key tenants: BENCH_TENANTS), the same rows' instructions per request
#                   under callgrind, the estimator's instructions per KB inside Envoy, and the cost per KB of
#                   1-256 KB bodies against Envoy's buffer filter (BENCH_BODY_KB): ~4 min more than without them
#   make run        Envoy on 127.0.0.1:10000 with envoy/envoy.yaml in front of two mock providers
#   make compose-test  envoy/docker-compose.yaml brought up with podman-compose on local stand-in images,
#                   smoke-tested and torn down (first run ~2.5 min to build the images, then ~20 s)
#   make oci        the filter as an OCI image Istio pulls (oci://): target/oci/tokengate, checked as Istio's fetcher
#                   reads it; OCI_PUSH=registry/name:tag pushes it (skopeo) and checks what the registry serves.
#                   Needs skopeo only (docs/deploying.md, "OCI image")
#   make deploy-check  a loopback OCI registry (docker-registry): the image pushed, read back with skopeo and
#                   checked against Istio's fetcher (and broken images refused); deploy/overlays rendered with
#                   kubectl kustomize and validated for Istio 1.24-1.28 (~15 s; run by .ci/run)
#   make clean      cargo clean, remove .run/ and the empty-filter build (keeps .venv)
#   make distclean  clean + remove .venv
#
# Works on a fresh Debian 12 as root with rustup/cargo and python3 (see scripts/deps.sh).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build
MAKEFLAGS += --no-print-directory

ROOT        := $(CURDIR)
WASM_TARGET := wasm32-wasip1
WASM        := $(ROOT)/target/$(WASM_TARGET)/release/tokengate.wasm
EMPTY_DIR   := $(ROOT)/bench/empty-filter
EMPTY_WASM  := $(EMPTY_DIR)/target/$(WASM_TARGET)/release/empty_filter.wasm

# Resolved when a recipe runs (after `deps` has installed it): $ENVOY_BIN if set, else the binary in .venv.
ENVOY_ENV = ENVOY_BIN="$$(scripts/envoy-bin.sh)" TOKENGATE_WASM="$(WASM)"

export CARGO_TERM_PROGRESS_WHEN := never

.PHONY: deps deps-rust build cli build-empty test soak fleet lint bench run compose-test oci deploy-check clean distclean

deps:
	@scripts/deps.sh

deps-rust:
	@scripts/deps.sh --rust-only

build: deps-rust
	@cargo build -q --release --target $(WASM_TARGET) -p tokengate
	@cargo build -q --release -p tokengate-cli

cli: deps-rust
	@cargo build -q --release -p tokengate-cli

build-empty: deps-rust
	@cargo build -q --release --target $(WASM_TARGET) \
		--manifest-path $(EMPTY_DIR)/Cargo.toml --target-dir $(EMPTY_DIR)/target

# The fault matrix prints its per-tenant lines (and an offending tenant's requests) in the log.
FAULTS_VERBOSE ?= 1

test: deps build
	cargo test --no-fail-fast -p tokengate
	$(ENVOY_ENV) FAULTS_VERBOSE=$(FAULTS_VERBOSE) cargo test --no-fail-fast -p wasm-test
	$(ENVOY_ENV) cargo test --no-fail-fast -p tokengate-cli
	@echo "make test: all passed"

SOAK_SECONDS ?= 300
SOAK_TENANTS ?= 60
SOAK_CLIENTS ?= 24
SOAK_RPS     ?= 100

soak: deps build
	$(ENVOY_ENV) FAULTS_SECONDS=$(SOAK_SECONDS) FAULTS_TENANTS=$(SOAK_TENANTS) \
		FAULTS_CLIENTS=$(SOAK_CLIENTS) FAULTS_RPS=$(SOAK_RPS) \
		cargo test -p wasm-test --test faults -- --nocapture

# FLEET_SECS: seconds of load per fleet run (the failover runs have their own fixed 16 s).
FLEET_SECS ?= 15

# The `#[ignore]`d tests of wasm-test/tests/{fleet,cluster}.rs, one at a time (each starts up to 3 Envoys,
# a Redis Cluster and an Envoy redis_proxy), with their tables printed.
fleet: deps build
	$(ENVOY_ENV) FLEET_SECS=$(FLEET_SECS) cargo test --no-fail-fast -p wasm-test --test fleet --test cluster --test upgrade \
		-- --ignored --test-threads=1 --nocapture
	@echo "make fleet: all passed"

# Runs all three checks, then fails if any failed. Clippy warnings are errors on both targets: native
# (the filter with its tests, benches and integration tests, and the wasm-test harness) and wasm32-wasip1.
lint: deps-rust
	@rc=0; \
	echo "cargo fmt --all -- --check"; cargo fmt --all -- --check || rc=1; \
	echo "scripts/check-imports.py"; python3 scripts/check-imports.py || rc=1; \
	echo "cargo clippy --workspace --all-targets -- -D warnings"; \
	cargo clippy -q --workspace --all-targets -- -D warnings || rc=1; \
	echo "cargo clippy -p tokengate --target $(WASM_TARGET) -- -D warnings"; \
	cargo clippy -q -p tokengate --target $(WASM_TARGET) -- -D warnings || rc=1; \
	exit $$rc

# BENCH_CALLGRIND: requests counted per row in the instruction table (0 = skip that table).
BENCH_CALLGRIND ?= 500
# BENCH_ESTIMATE: corpus classes of the estimator-in-Envoy table (instructions per KB under callgrind,
# `all` = every corpus file, empty = skip it); BENCH_ESTIMATE_N: requests per class there.
BENCH_ESTIMATE ?= all
BENCH_ESTIMATE_N ?= 40
# BENCH_TENANTS: tenant counts of the leased rows whose requests go round that many API-key tenants (timed
# table only; empty = no such rows). Each round of the 10,000 row starts with a warm pass of up to 10 s.
BENCH_TENANTS ?= 1,100,10000
# BENCH_BODY_KB: body sizes of the big-body sweep (callgrind instructions per request and per KB: no filter,
# Envoy's buffer filter, empty wasm buffering, tokengate; ~2.5 min; empty = skip it); BENCH_BODY_N: requests
# counted per body and row there. The timed version of the sweep is not run here (too coarse on a shared
# host): `BENCH_BODY_KB=1,16,64,256 target/release/bench`.
BENCH_BODY_KB ?= 1,16,64,256
BENCH_BODY_N ?= 20

# The estimator benchmark fails when a corpus class misses its accuracy targets; the Envoy part still
# runs, and `make bench` fails at the end.
bench: build build-empty
	@scripts/deps.sh --bench
	@est=0; \
	if [ -f benches/estimate.rs ]; then \
		echo "cargo bench --bench estimate -p tokengate --features exact"; cargo bench --bench estimate -p tokengate --features exact || est=1; \
	else echo "make bench: benches/estimate.rs not there yet, skipping the estimator micro-benchmark"; fi; \
	echo "cargo bench --bench rewrite -p tokengate"; cargo bench --bench rewrite -p tokengate; \
	cargo build -q --release -p wasm-test --bin bench; \
	echo "BENCH_TENANTS=$(BENCH_TENANTS) target/release/bench   (timed: req/s, CPU, latency)"; \
	env -u BENCH_CALLGRIND -u BENCH_ESTIMATE -u BENCH_BODY_KB $(ENVOY_ENV) EMPTY_WASM="$(EMPTY_WASM)" \
		BENCH_TENANTS="$(BENCH_TENANTS)" $(ROOT)/target/release/bench; \
	if [ "$(BENCH_CALLGRIND)" != 0 ]; then \
		echo "BENCH_CALLGRIND=$(BENCH_CALLGRIND) target/release/bench   (instructions per request, callgrind)"; \
		env -u BENCH_ESTIMATE -u BENCH_TENANTS -u BENCH_BODY_KB $(ENVOY_ENV) EMPTY_WASM="$(EMPTY_WASM)" BENCH_CALLGRIND=$(BENCH_CALLGRIND) $(ROOT)/target/release/bench; \
	fi; \
	if [ -n "$(BENCH_ESTIMATE)" ]; then \
		echo "BENCH_ESTIMATE=$(BENCH_ESTIMATE) BENCH_CALLGRIND=$(BENCH_ESTIMATE_N) target/release/bench   (estimator instructions per KB in Envoy)"; \
		env -u BENCH_TENANTS -u BENCH_BODY_KB $(ENVOY_ENV) EMPTY_WASM="$(EMPTY_WASM)" BENCH_CALLGRIND=$(BENCH_ESTIMATE_N) BENCH_ESTIMATE="$(BENCH_ESTIMATE)" \
			BENCH_VARIANTS="empty wasm (buffer,tokengate (buckets)" $(ROOT)/target/release/bench; \
	fi; \
	if [ -n "$(BENCH_BODY_KB)" ]; then \
		echo "BENCH_BODY_KB=$(BENCH_BODY_KB) BENCH_CALLGRIND=$(BENCH_BODY_N) target/release/bench   (cost per KB of body vs Envoy's buffer filter)"; \
		env -u BENCH_ESTIMATE -u BENCH_TENANTS -u BENCH_VARIANTS $(ENVOY_ENV) EMPTY_WASM="$(EMPTY_WASM)" BENCH_CALLGRIND=$(BENCH_BODY_N) \
			BENCH_BODY_KB="$(BENCH_BODY_KB)" $(ROOT)/target/release/bench; \
	fi; \
	if [ $$est != 0 ]; then echo "make bench: the estimator missed its accuracy targets (see above)"; exit 1; fi

run: deps build
	@cargo build -q --release -p wasm-test --bin mock-provider
	@$(ENVOY_ENV) scripts/run.sh

compose-test: deps build
	@scripts/deps.sh --containers
	@cargo build -q --release -p wasm-test --bin mock-provider
	@scripts/compose-test.sh

# OCI_PUSH: registry/name:tag to push the image to (empty: build target/oci/tokengate only).
OCI_PUSH ?=

oci: build
	@scripts/deps.sh --oci
	@scripts/oci.sh $(if $(OCI_PUSH),--push "$(OCI_PUSH)")

deploy-check: build
	@scripts/deps.sh --deploy
	@scripts/deploy-check.sh

clean:
	cargo clean -q
	rm -rf .run $(EMPTY_DIR)/target

distclean: clean
	rm -rf .venv
