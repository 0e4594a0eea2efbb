//! Quota leases: what this Envoy holds of a tenant's monthly quota, in shared data ([`account`]), and the
//! Redis side — the lease script and its replies ([`redis`]); the input/output split of leased requests
//! ([`io`]).

pub mod account;
pub mod io;
pub mod redis;
