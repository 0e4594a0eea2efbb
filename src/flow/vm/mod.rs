//! Per-VM work, apart from the per-request phases: what one VM keeps ([`state`]) and what its root
//! context does each tick ([`tick`]) — settlements through the shared-data journal ([`settle`]),
//! global credits ([`credits`]), quota and global-bucket lease calls ([`leases`], [`gleases`]), the
//! breakers' batched writes ([`breakers`]), the shim probes at start ([`probes`]).
//!
//! Requests use these services (hold, queue a settlement or a credit, reserve from a lease); nothing
//! here knows a request's state.

pub mod batch;
pub mod breakers;
pub mod credits;
pub mod gleases;
pub mod leases;
pub mod probes;
pub mod settle;
pub mod state;
pub mod tick;
