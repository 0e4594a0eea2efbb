//! Global token buckets, kept in Redis through the Webdis shim and shared by every Envoy: the keys, the
//! Lua script (`bucket.lua`), the command bodies and the replies ([`bucket`]), and this Envoy's leases of
//! them in shared data ([`lease`]).

pub mod bucket;
pub mod lease;

pub use bucket::*;
