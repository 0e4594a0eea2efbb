//! Monthly token quotas kept in Redis behind Webdis. Pure: no `proxy_wasm`, time comes in as a parameter.
//!
//! # Why
//! Token buckets live in Envoy's shared data (one process); a monthly quota must hold across every Envoy,
//! so it lives in Redis. One request costs one callout: a single Lua script checks and charges all keys
//! atomically (all or nothing) and records the reservation with a deadline; a second script, off the
//! request path and batched per tenant, replaces the reservation by the real usage once the provider
//! reports it (or charges a request that has no known reservation). A reservation never settled (Envoy
//! stopped) is resolved by the next call that sees it past its deadline: charged its prompt.
//!
//! # Parts
//! * [`keys`]: the Redis keys of one request ([`QuotaKeys`]), all under the tenant's hash tag.
//! * [`scripts`]: the Lua scripts (`src/quota/*.lua`), their SHA-1s and the Webdis bodies that call them
//!   ([`reserve_request`], [`settle_request`]).
//! * [`replies`]: the parsed answers ([`parse_reserve_reply`], [`parse_settle_reply`]).
//! * [`weights`]: per-model cost weights and the weighted cost ([`weighted`]).
//! * [`marker`]: the quota-exhausted marker kept in shared data ([`ExhaustedMarker`]).
//!
//! Months come from [`crate::quota::calendar`] (counters expire at a *fixed* instant, `EXPIREAT month_end +
//! grace`, so repeated calls never push the expiry forward), the Webdis encoding and the failure classes
//! ([`crate::shim::webdis::ShimError`]) from [`crate::shim::webdis`], key sanitizing from [`crate::store::keys`].
//!
//! # Example
//! ```
//! # use tokengate::quota::*;
//! # use tokengate::quota::calendar::{month_end_unix, month_label};
//! # use tokengate::shim::webdis::ScriptCall;
//! let now = 1_795_000_000; // 2026-11-18T…Z
//! let args = ReserveArgs {
//!     tenant: "acme".into(), model: Some("gpt-4.1".into()), month: month_label(now, 0),
//!     request_id: "req-1".into(), prompt_cost: 120, output_cost: 1024, default_limit: 1_000_000,
//!     default_model_limit: 0, expire_at_unix: month_end_unix(now, 0) + 7 * 86_400,
//!     deadline_s: 3600, clamp_output: false, min_output_cost: 0, lease_owner: lease_owner(7),
//! };
//! let body = reserve_request(&args, ScriptCall::EvalSha);
//! assert!(body.starts_with("EVALSHA/"));
//! let reply = parse_reserve_reply(200, br#"{"EVALSHA":[1,1144,1000000,1144,-1,0,1024,0]}"#).unwrap();
//! assert!(reply.allowed && reply.model_limit.is_none());
//! ```

pub mod accounting;
pub mod batch;
pub mod calendar;
pub mod keys;
pub mod lease;
pub mod marker;
pub mod replies;
pub mod scripts;
pub mod settlement;
pub mod weights;

pub use keys::{tenant_prefix, tenant_tag, QuotaKeys};
pub use lease::batch::{lease_batch_request, parse_lease_batch_reply, LEASE_BATCH_SHA1};
pub use lease::redis::{
    lease_id, lease_owner, lease_request, parse_lease_reply, LeaseArgs, LeaseReply, LEASE_SCRIPT,
    LEASE_SHA1,
};
pub use marker::ExhaustedMarker;
pub use replies::{parse_reserve_reply, parse_settle_reply, Reason, ReserveReply};
pub use scripts::{
    reserve_request, settle_request, ReserveArgs, SettleArgs, SettleMode, QUOTA_PROTOCOL_TAG,
    RESERVE_SCRIPT, RESERVE_SHA1, SETTLE_SCRIPT, SETTLE_SHA1, TOMBSTONE_S,
};
pub use weights::{
    clamped_output_tokens, min_clamped_output_cost, output_tokens_for_cost, weighted, Weights,
};
