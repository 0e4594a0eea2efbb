//! The host adapter: the only code that talks to Envoy (through [`abi`], and the SDK's context traits).
//!
//! It reads headers, bodies, time and shared data, calls the pure modules, and writes their decisions
//! back. Per-VM state (config, metric ids, held requests) lives in a thread-local [`Vm`]: each Envoy
//! worker has its own VM, so this is never shared across threads; cross-worker state lives only in
//! shared data.

pub mod abi;
pub mod gauges;
pub mod global;
pub mod http;
pub mod metrics;
pub mod quota;
pub mod root;
pub mod store;

use std::cell::RefCell;

/// Per-VM state shared by the root context and the HTTP contexts of one worker.
#[derive(Default)]
pub struct Vm {
    /// Requests held by shaping: (context id, release time ns).
    pub held: Vec<(u32, u64)>,
    /// Bucket keys known to exist in shared data (saves a read per request; bounded).
    pub known_keys: crate::admission::KeySet,
    /// Settlements waiting for the root's tick.
    pub settle_queue: Vec<quota::SettleJob>,
    /// Settlements sent, by callout token (one tenant's batch, or one reconciliation).
    pub settle_inflight: std::collections::HashMap<u32, Vec<quota::SettleJob>>,
    /// Tenant ids of recently seen API keys.
    pub key_tenants: crate::identity::KeyCache,
    /// Redis has our scripts cached (EVALSHA works).
    pub script_loaded: bool,
    /// Redis has the global bucket script cached.
    pub global_script_loaded: bool,
    /// Global bucket credits waiting for the root's tick: (key, rule index, tokens).
    pub global_credits: Vec<(String, usize, i64)>,
    /// Global bucket credits sent, by callout token.
    pub global_credits_inflight: std::collections::HashMap<u32, (String, usize, i64)>,
}

/// Most entries kept in [`Vm::known_keys`] before it is cleared.
pub const KNOWN_KEYS_CACHE: usize = 50_000;

thread_local! {
    /// This VM's state.
    pub static VM: RefCell<Vm> = RefCell::new(Vm::default());
}

/// Host time in ns since the epoch (0 if the host refuses, which Envoy never does).
pub fn now_ns() -> u64 {
    abi::now_ns().unwrap_or(0)
}

/// Logs one line at `level` (Envoy prefixes it with `wasm log <plugin> <root_id>:`).
pub fn log(level: abi::Level, msg: &str) {
    abi::log(level, msg);
}
