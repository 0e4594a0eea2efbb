# tokengate — build, test, lint, bench and run the proxy-wasm filter.
#
#   make deps       wasm32-wasip1 target, .venv with Envoy 1.40.0, redis-server + webdis (idempotent)
#   make build      release .wasm: target/wasm32-wasip1/release/tokengate.wasm
#   make test       unit tests (native) + integration tests through real Envoy + `envoy --mode validate` of envoy/
#   make fleet      the long fleet tests (~6 min on 2 cores, run one at a time): three Envoys × 2 workers
#                   sharing one Redis and a Redis Cluster (3 masters + 3 replicas behind Envoy's redis_proxy)
#                   under 100 tenants (FLEET_SECS of load per run, default 15), and a Cluster master killed
#                   under load; prints each run's figures (docs/scaling.md). Their smoke versions are in make test
#   make lint       rustfmt check, clippy -D warnings: native (workspace, all targets) and wasm32-wasip1
#   make bench      estimator and body-rewrite micro-benchmarks, then Envoy side by side: no filter / empty wasm / tokengate
#                   (req/s, CPU, latency), then the same rows' instructions per request under callgrind
#   make run        Envoy on 127.0.0.1:10000 with envoy/envoy.yaml in front of two mock providers
#   make compose-test  envoy/docker-compose.yaml brought up with podman-compose on local stand-in images,
#                   smoke-tested and torn down (first run ~2.5 min to build the images, then ~20 s)
#   make oci        the filter as an OCI image Istio can pull (oci://), built with Podman (see docs/deploying.md)
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

.PHONY: deps deps-rust build build-empty test fleet lint bench run compose-test oci clean distclean

deps:
	@scripts/deps.sh

deps-rust:
	@scripts/deps.sh --rust-only

build: deps-rust
	@cargo build -q --release --target $(WASM_TARGET) -p tokengate

build-empty: deps-rust
	@cargo build -q --release --target $(WASM_TARGET) \
		--manifest-path $(EMPTY_DIR)/Cargo.toml --target-dir $(EMPTY_DIR)/target

test: deps build
	cargo test --no-fail-fast -p tokengate
	$(ENVOY_ENV) cargo test --no-fail-fast -p wasm-test
	@echo "make test: all passed"

# FLEET_SECS: seconds of load per fleet run (the failover runs have their own fixed 16 s).
FLEET_SECS ?= 15

# The `#[ignore]`d tests of wasm-test/tests/{fleet,cluster}.rs, one at a time (each starts up to 3 Envoys,
# a Redis Cluster and an Envoy redis_proxy), with their tables printed.
fleet: deps build
	$(ENVOY_ENV) FLEET_SECS=$(FLEET_SECS) cargo test --no-fail-fast -p wasm-test --test fleet --test cluster \
		-- --ignored --test-threads=1 --nocapture
	@echo "make fleet: all passed"

# Runs all three checks, then fails if any failed. Clippy warnings are errors on both targets: native
# (the filter with its tests, benches and integration tests, and the wasm-test harness) and wasm32-wasip1.
lint: deps-rust
	@rc=0; \
	echo "cargo fmt --all -- --check"; cargo fmt --all -- --check || rc=1; \
	echo "cargo clippy --workspace --all-targets -- -D warnings"; \
	cargo clippy -q --workspace --all-targets -- -D warnings || rc=1; \
	echo "cargo clippy -p tokengate --target $(WASM_TARGET) -- -D warnings"; \
	cargo clippy -q -p tokengate --target $(WASM_TARGET) -- -D warnings || rc=1; \
	exit $$rc

# BENCH_CALLGRIND: requests counted per row in the instruction table (0 = skip that table).
BENCH_CALLGRIND ?= 500

bench: build build-empty
	@scripts/deps.sh --bench
	@if [ -f benches/estimate.rs ]; then \
		echo "cargo bench --bench estimate -p tokengate"; cargo bench --bench estimate -p tokengate; \
	else echo "make bench: benches/estimate.rs not there yet, skipping the estimator micro-benchmark"; fi
	@echo "cargo bench --bench rewrite -p tokengate"; cargo bench --bench rewrite -p tokengate
	@cargo build -q --release -p wasm-test --bin bench
	env -u BENCH_CALLGRIND $(ENVOY_ENV) EMPTY_WASM="$(EMPTY_WASM)" $(ROOT)/target/release/bench
	@if [ "$(BENCH_CALLGRIND)" != 0 ]; then \
		echo "BENCH_CALLGRIND=$(BENCH_CALLGRIND) target/release/bench   (instructions per request, callgrind)"; \
		$(ENVOY_ENV) EMPTY_WASM="$(EMPTY_WASM)" BENCH_CALLGRIND=$(BENCH_CALLGRIND) $(ROOT)/target/release/bench; \
	fi

run: deps build
	@cargo build -q --release -p wasm-test --bin mock-provider
	@$(ENVOY_ENV) scripts/run.sh

compose-test: deps build
	@scripts/deps.sh --containers
	@cargo build -q --release -p wasm-test --bin mock-provider
	@scripts/compose-test.sh

# OCI_IMAGE: the tag of the image (push it with `podman push $(OCI_IMAGE) <registry>/<name>:<tag>`).
OCI_IMAGE ?= localhost/tokengate-wasm:latest

oci: build
	@scripts/deps.sh --containers
	@scripts/oci.sh "$(OCI_IMAGE)"

clean:
	cargo clean -q
	rm -rf .run $(EMPTY_DIR)/target

distclean: clean
	rm -rf .venv
