//! The pure core of the filter: what happens to one request, and what one VM does between requests.
//! Nothing here reads a clock or calls Envoy on its own: time, headers, bodies and properties come
//! through the [`Host`] view of the callback, shared data is read and written synchronously through its
//! store port ([`Cx::store`], a host call each), and everything else the host should do comes back as
//! [`Effect`]s, which the host adapter (`crate::host`) applies. Native tests drive every branch with
//! `fake::FakeEnvoy`, which follows Envoy 1.40's rules.
//!
//! * [`request`]: one request, a function per Envoy callback. Envoy 1.40 shapes it (see
//!   docs/internals.md, "The request, phase by phase"): a pause in the request-headers callback means the body never arrives, and
//!   request headers can no longer be changed once the body is read. So the headers phase decides what
//!   the headers allow (the upstream is never contacted for a request refused there), and the body phase
//!   reads the body and admits it step by step — **the order is in [`request::pipeline`]**, each step in
//!   its own file under `request/steps/`. Then the response (usage, headers) and the end (settlement,
//!   refunds, breaker outcomes).
//! * [`vm`]: per-VM work apart from the requests — the tick, settlements, lease calls, credits, probes,
//!   the breakers' batched writes — and the VM's state.
//! * Leaves both use: [`effect`] (the vocabulary between the core and the host), [`cx`] (what every
//!   function works with), [`metric`], [`logs`] (the rate-limited log gate), [`shim`] (the Webdis
//!   shims' breakers and answers).
//!
//! Files import each other in one direction only: `request` uses `vm` and the leaves, `vm` uses the
//! leaves, a leaf uses no other part of the flow (`make lint` checks there is no circle).

pub mod apply;
pub mod cx;
pub mod effect;
#[cfg(test)]
pub mod fake;
pub mod logs;
pub mod metric;
pub mod request;
pub mod shim;
pub mod vm;

#[cfg(test)]
mod tests;

pub use cx::Cx;
pub use effect::{Body, Callout, CalloutReply, Effect, Headers, Host, Level, Next, Purpose, Value};
pub use metric::Metric;
pub use request::state::Request;
pub use vm::state::Worker;
