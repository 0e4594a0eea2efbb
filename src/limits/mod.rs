//! Limits in this Envoy's shared data: the token-bucket math ([`bucket`]), the bucket records of rules
//! and limits and their charge, credit and refusals ([`local`]), and the in-flight semaphores of
//! `max_in_flight` ([`inflight`]). Global (Redis) buckets are in [`crate::global`].

pub mod bucket;
pub mod fair;
pub mod inflight;
pub mod local;
