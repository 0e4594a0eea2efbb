//! Harness for driving the built `tokengate.wasm` inside a real Envoy 1.40, on loopback only.
//!
//! Every integration test in `wasm-test/tests/` builds on these pieces:
//!
//! ```no_run
//! use wasm_test::{http, Envoy, EnvoyOpts, MockProvider};
//! use serde_json::json;
//!
//! let mock = MockProvider::start();
//! let envoy = Envoy::start(EnvoyOpts::new(mock.port, json!({"rules": [
//!     {"name": "all", "tenant": "*", "model": "*", "tokens_per_second": 10, "burst": 1000}]})))
//!     .unwrap();
//! let resp = http::post(envoy.port, "/v1/chat/completions", &[("x-tenant-id", "a")],
//!     br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
//! assert_eq!(resp.status, 200);
//! ```
//!
//! - [`MockProvider`]: spawns the `mock-provider` binary (see `src/bin/mock-provider.rs`).
//! - [`Envoy`]: renders `templates/envoy-test.yaml` with free ports into a fresh temp dir and runs
//!   Envoy with the filter; exposes its log, access log and stats.
//! - [`http`]: a small HTTP/1.1 client (one-shot, keep-alive, streaming with abort).
//! - [`RedisServer`], [`Webdis`], [`redis_cmd`]: for the quota tests.
//! - [`faults`]: processes paused, killed and restarted on their ports, upstream faults, the mock's
//!   served-usage ledger (the fault-matrix tests).
//! - [`cluster`]: a Redis Cluster (3 masters + 3 replicas), Envoy's `redis_proxy` in front of it, and
//!   Webdis in front of that (the fleet tests).
//! - [`sdk`]: the official Python SDKs as clients (`wasm-test/sdk/driver.py`).
//! - [`fleet`]: client load over several Envoys with per-tenant tallies of what was served, and the
//!   Redis side of a tenant's quota (plain Redis or Cluster).
//!
//! Every spawned process is killed by PID when its handle drops. Set `KEEP_TMP=1` to keep the temp
//! dirs (bootstrap, logs) for inspection.

pub mod cluster;
pub mod envoy;
pub mod faults;
pub mod fleet;
pub mod http;
pub mod mock;
pub mod paths;
pub mod redis;
pub mod sdk;
pub mod tg;

pub use envoy::*;
pub use mock::*;
pub use paths::*;
pub use redis::*;

/// The Envoy bootstrap template (placeholders `{{NAME}}`).
pub const BOOTSTRAP_TEMPLATE: &str = include_str!("../templates/envoy-test.yaml");

/// Body of `r` as JSON (see [`http::json`]).
pub fn json(r: &http::Response) -> serde_json::Value {
    http::json(r)
}
