//! Quota leases: what this Envoy holds of a tenant's monthly quota, in shared data ([`account`]), and the
//! Redis side — the lease script and its replies ([`redis`]), many accounts' syncs in one call
//! ([`batch`]), and the input/output split of leased requests ([`io`]).

pub mod account;
pub mod batch;
pub mod io;
pub mod redis;
