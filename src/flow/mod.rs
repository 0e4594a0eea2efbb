//! The request flow, pure: one function per Envoy callback that takes what the host showed and returns
//! [`Effect`]s for the host adapter (`crate::host`) to apply.
//!
//! Envoy 1.40 shapes the flow (see `shared/ENVOY-NOTES.md`): a pause in the request-headers callback means
//! the body never arrives, and request headers can no longer be read or changed once the body is read. So:
//!
//! 1. **Request headers** ([`Request::on_request_headers`], `headers.rs`): non-LLM paths and non-POST
//!    methods pass untouched. Resolve the tenant (401 when none), refuse a `content-length` over
//!    `max_body_bytes` (413), a tenant whose quota is known exhausted (429), an open cluster breaker
//!    (fallback route or 503), a bucket known from the headers alone that cannot pass one token (429).
//!    Any of these answers means the upstream is never contacted. Otherwise continue (Envoy starts the
//!    upstream request); `content-length` is removed when the body may be rewritten.
//! 2. **Request body** ([`Request::on_request_body`], `body.rs`): buffer to the end (413 past
//!    `max_body_bytes`), estimate, pick the model (breaker fallback), edit the body, then run the
//!    admission steps in order — local bucket, breaker admissions, global bucket (callout), quota
//!    reservation (callout) — and continue, hold (shaping) or answer. Refusals here drop the upstream
//!    request Envoy already started.
//! 3. **Callout replies** ([`Request::on_callout_reply`], `callout.rs`): the global charge and the quota
//!    reservation answer; the admission resumes where it paused.
//! 4. **Response** ([`Request::on_response_headers`], [`Request::on_response_body`], `response.rs`):
//!    rate-limit, quota and fallback headers; SSE chunks scanned (usage, final event; the injected usage
//!    chunk stripped) or a JSON body kept for its `usage`.
//! 5. **End** ([`Request::on_log`], `end.rs`): the breaker outcome, the quota settlement (queued for the
//!    root's tick), `refund_unused`.
//!
//! Per-VM state (held requests, settlement and credit queues, key caches) is a [`Worker`]; the root's tick
//! ([`worker::on_tick`]) releases held requests and sends queued settlements and credits.
//!
//! Nothing here reads a clock or calls Envoy: time, headers, bodies, properties and shared data come
//! through [`Host`] and [`Headers`]; tests drive every branch with `fake::FakeEnvoy`, which follows
//! Envoy 1.40's rules.

mod admit;
mod answers;
mod body;
mod breakers;
mod callout;
mod end;
#[cfg(test)]
pub mod fake;
mod glease;
mod global_step;
mod headers;
mod lease;
pub mod logs;
pub mod metric;
mod reserve;
mod response;
mod settle;
mod shim;
mod state;
pub mod worker;

#[cfg(test)]
mod tests;

use crate::config::Config;
use crate::reply::LocalReply;
use crate::store::SharedStore;
use std::borrow::Cow;

pub use metric::Metric;
pub use state::Request;
pub use worker::Worker;

/// What the host does after a stream callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Let the stream go on.
    Continue,
    /// Stop iteration (waiting for the body, a callout or a hold; or a local reply was sent).
    Pause,
}

/// Log levels of [`Effect::Log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Debug.
    Debug,
    /// Info.
    Info,
    /// Warn.
    Warn,
    /// Error.
    Error,
}

/// A header map as the host showed it (lookup by lower-case name; the first value of a repeated header).
pub trait Headers {
    /// The value of `name`, if present.
    fn get(&self, name: &str) -> Option<&str>;
    /// Whether `name` comes more than once with different values (an upstream may read another line
    /// than [`get`](Headers::get)'s first).
    fn differs(&self, name: &str) -> bool;
}

impl Headers for [(&str, &str)] {
    fn get(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
    fn differs(&self, name: &str) -> bool {
        let first = Headers::get(self, name);
        self.iter()
            .any(|(k, v)| k.eq_ignore_ascii_case(name) && Some(*v) != first)
    }
}

impl Headers for Vec<(String, String)> {
    fn get(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn differs(&self, name: &str) -> bool {
        let first = Headers::get(self, name);
        self.iter()
            .any(|(k, v)| k.eq_ignore_ascii_case(name) && Some(v.as_str()) != first)
    }
}

/// Which body a [`Host::body`] read is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// The buffered request body.
    Request,
    /// The current response chunk.
    ResponseChunk,
}

/// What the flow may read from the host, synchronously.
pub trait Host {
    /// Host time, ns since the epoch.
    fn now_ns(&self) -> u64;
    /// Envoy's shared data for this `vm_id`.
    fn store(&self) -> &dyn SharedStore;
    /// A stream property (`xds.cluster_name`, `response.code`, `response.code_details`).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// The first `size` bytes of a body (`None` when the host refuses).
    fn body(&self, which: Body, size: usize) -> Option<Vec<u8>>;
}

/// Why a callout was made: how its reply is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A request's global bucket charge.
    GlobalCharge,
    /// A request's quota reservation.
    Reserve,
    /// A batch of quota settlements (or one reconciliation), by [`Worker`] batch id.
    Settle(u64),
    /// A global bucket credit, by [`Worker`] credit id.
    Credit(u64),
    /// The check of a shim cluster when the VM starts (Webdis `PING`).
    Probe,
    /// A quota lease sync, by lease id of the VM.
    Lease(u64),
    /// A global-bucket lease top-up or give-back, by id of the VM.
    GlobalLease(u64),
    /// A request's give-back of this Envoy's quota lease before its reservation is sent again
    /// (`flow::lease::give_back`).
    LeaseGiveBack,
}

/// One HTTP callout to a Webdis shim (`POST /` with a form-encoded command body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callout {
    /// What it is for.
    pub purpose: Purpose,
    /// Envoy cluster.
    pub cluster: String,
    /// `:authority`.
    pub authority: String,
    /// Timeout.
    pub timeout_ms: u32,
    /// The command (see [`crate::shim::webdis::webdis_encode`]).
    pub body: String,
}

/// The answer to a callout as the host delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalloutReply {
    /// HTTP status (`0` when the host refused the dispatch itself; Envoy's synthetic 503/504 for a dead
    /// cluster or a timeout).
    pub status: u32,
    /// Body.
    pub body: Vec<u8>,
    /// The host refused to dispatch (unknown cluster …): its status.
    pub refused: Option<u32>,
}

impl CalloutReply {
    /// A delivered answer.
    pub fn answer(status: u32, body: impl Into<Vec<u8>>) -> Self {
        CalloutReply {
            status,
            body: body.into(),
            refused: None,
        }
    }
    /// The host refused the dispatch with `status`.
    pub fn refused(status: u32) -> Self {
        CalloutReply {
            status: 0,
            body: Vec::new(),
            refused: Some(status),
        }
    }
}

/// A header value; numbers are formatted by the host on the stack (no allocation on the hot path).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Text as is.
    Text(String),
    /// A whole number.
    Int(u64),
    /// Seconds, as a short decimal rounded up to the millisecond (`0.25`, `3`).
    Secs(f64),
}

impl Value {
    /// Calls `f` with the value as text.
    pub fn with_str<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            Value::Text(s) => f(s),
            Value::Int(n) => f(crate::reply::Dec::int(*n).as_str()),
            Value::Secs(s) => f(crate::reply::Dec::secs(*s).as_str()),
        }
    }
    /// The value as text.
    pub fn to_text(&self) -> String {
        self.with_str(str::to_string)
    }
}

/// What the host adapter must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Answer the client with a local reply (`details` for Envoy's response code details).
    Reply {
        /// The reply.
        reply: LocalReply,
        /// Response code details.
        details: &'static str,
    },
    /// Set a request header (headers phase only).
    SetRequestHeader(Cow<'static, str>, String),
    /// Remove a request header (headers phase only).
    RemoveRequestHeader(Cow<'static, str>),
    /// Replace the whole buffered request body.
    ReplaceRequestBody(Vec<u8>),
    /// Set a response header.
    SetResponseHeader(Cow<'static, str>, Value),
    /// Remove a response header.
    RemoveResponseHeader(Cow<'static, str>),
    /// Replace the current response chunk.
    ReplaceResponseChunk(Vec<u8>),
    /// Append bytes after the current response chunk (end of stream).
    AppendResponseBody(Vec<u8>),
    /// Dispatch a callout; a per-request one answers through [`Request::on_callout_reply`], a root one
    /// through [`worker::on_callout_reply`]. If the host refuses it, the adapter delivers
    /// [`CalloutReply::refused`] at once.
    Dispatch(Callout),
    /// Resume the paused request (after a callout answered, or a hold ended).
    Resume,
    /// Resume the paused request of another context (a hold released by the root's tick).
    ResumeContext(u32),
    /// Write the audit record (`tokengate_audit` filter state).
    Audit(String),
    /// Add to a counter.
    Count(Metric, u64),
    /// Set a gauge (breaker state per key).
    Gauge(String, u64),
    /// Log one line.
    Log(Level, String),
}

/// What every flow function works with.
pub struct Cx<'a> {
    /// The configuration.
    pub cfg: &'a Config,
    /// The host view.
    pub host: &'a dyn Host,
    /// This VM's state.
    pub worker: &'a mut Worker,
    /// Effects, appended in order.
    pub fx: &'a mut Vec<Effect>,
}

impl Cx<'_> {
    /// Host time.
    pub fn now(&self) -> u64 {
        self.host.now_ns()
    }
    /// Shared data.
    pub fn store(&self) -> &dyn SharedStore {
        self.host.store()
    }
    /// Counts one.
    pub fn inc(&mut self, m: Metric) {
        self.fx.push(Effect::Count(m, 1));
    }
    /// Counts `n` (nothing for 0).
    pub fn add(&mut self, m: Metric, n: u64) {
        if n > 0 {
            self.fx.push(Effect::Count(m, n));
        }
    }
    /// Logs one line, unconditionally (transitions, configuration).
    pub fn log(&mut self, level: Level, msg: String) {
        self.fx.push(Effect::Log(level, msg));
    }
    /// Logs a line about a failing dependency, rate-limited per `cause` (see [`logs::LogGate`]).
    pub fn log_failure(&mut self, level: Level, cause: &'static str, msg: String) {
        let now = self.now();
        match self.worker.logs.admit(cause, now) {
            logs::Gate::Log { suppressed } => {
                let line = if suppressed > 0 {
                    format!("{msg} ({suppressed} more like it suppressed)")
                } else {
                    msg
                };
                self.fx.push(Effect::Log(level, line));
            }
            logs::Gate::Suppress => self.inc(Metric::LogsSuppressed),
        }
    }
}
