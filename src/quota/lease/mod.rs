//! Quota leases: what this Envoy holds of a tenant's monthly quota, in shared data ([`account`]), and the
//! Redis side — the lease script and its replies ([`redis`]), and many accounts' syncs in one call
//! ([`batch`]).

pub mod account;
pub mod batch;
pub mod redis;
