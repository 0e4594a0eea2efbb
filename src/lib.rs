//! tokengate: a proxy-wasm filter for Envoy that decides, per request, whether a tenant may spend tokens
//! on an LLM provider, and accounts for what was spent.
//!
//! Only `host/` touches `proxy_wasm`; every other module is plain Rust, tested natively, with time passed
//! in as a parameter. The only `unsafe` code is the raw ABI in `host/abi.rs` (its one
//! `allow(unsafe_code)`); everywhere else it is denied.
#![deny(unsafe_code, clippy::undocumented_unsafe_blocks)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

pub mod breaker;
pub mod config;
pub mod estimate;
pub mod flow;
pub mod global;
pub mod host;
pub mod identity;
pub mod limits;
pub mod quota;
pub mod reply;
pub mod rewrite;
pub mod shim;
pub mod store;
pub mod usage;

// The Envoy entry point, only in the wasm build: native test binaries need no `_initialize` export.
#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(host::root::Root::default())
    });
}}
