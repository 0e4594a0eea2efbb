//! What the pure core and the host adapter say to each other: what a callback reads from the host
//! ([`Host`], [`Headers`], [`Body`]) and what it asks the host to do ([`Effect`]s, applied in order by
//! [`super::apply`]), the callouts ([`Callout`], [`Purpose`], [`CalloutReply`]) and what a stream
//! callback returns ([`Next`]). A leaf: it names no other part of the flow.

use super::metric::Metric;
use crate::reply::LocalReply;
use crate::store::SharedStore;
use std::borrow::Cow;

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
    /// A recent host time without a host call when one can serve: this callback's reading, or the
    /// last one any callback of this VM made (a busy VM reads the clock at every request; an idle one
    /// at its tick). For what may lag by that much: counting plain successes of a failure-rate breaker.
    fn recent_ns(&self) -> u64 {
        self.now_ns()
    }
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
    /// Reservations of several requests in one call (`flow::vm::batch`), by batch id of the VM.
    Batch(u64),
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
    /// Have the root context run soon (its `on_queue_ready`): reservations wait to be sent as one call
    /// (`flow::vm::batch`). A request cannot send that call itself: its answer would come back to the
    /// request, and be lost with it if its client goes.
    WakeRoot,
    /// Write the audit record (`tokengate_audit` filter state).
    Audit(String),
    /// Add to a counter.
    Count(Metric, u64),
    /// Set a gauge (breaker state per key, a fair limit's members and share).
    Gauge(String, u64),
    /// Add to a counter named at run time (a fair limit's refusals), bounded by the configuration.
    CountNamed(String, u64),
    /// Log one line.
    Log(Level, String),
}
