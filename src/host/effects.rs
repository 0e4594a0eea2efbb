//! Applying the flow's effects that do not depend on the context kind: counters, gauges, logs, the audit
//! record. The per-context ones (replies, headers, bodies, callouts, resumes) are applied by
//! [`super::http`] and [`super::root`].

use super::abi::{self, Level};
use super::{gauges, metrics};
use crate::flow::{self, Effect};

/// Applies a context-free effect; gives it back when it is not one.
pub fn apply_common(e: Effect) -> Option<Effect> {
    match e {
        Effect::Count(m, n) => metrics::add(m, n),
        Effect::Gauge(name, v) => gauges::set(&name, v),
        Effect::Log(level, msg) => abi::log(level_of(level), &msg),
        Effect::Audit(rec) => {
            let _ = abi::set_property(&["tokengate_audit"], rec.as_bytes());
        }
        other => return Some(other),
    }
    None
}

fn level_of(l: flow::Level) -> Level {
    match l {
        flow::Level::Debug => Level::Debug,
        flow::Level::Info => Level::Info,
        flow::Level::Warn => Level::Warn,
        flow::Level::Error => Level::Error,
    }
}

/// Starts a callout to a Webdis shim (`POST /`, form-encoded command).
pub fn dispatch(c: &flow::Callout) -> Result<u32, u32> {
    let len = c.body.len().to_string();
    abi::dispatch_http_call(
        &c.cluster,
        &[
            (":method", "POST"),
            (":path", crate::shim::webdis::WEBDIS_PATH),
            (":authority", &c.authority),
            ("content-type", "application/x-www-form-urlencoded"),
            ("content-length", &len),
        ],
        c.body.as_bytes(),
        c.timeout_ms,
    )
}

/// The callout answer being delivered.
pub fn call_reply(body_size: usize) -> flow::CalloutReply {
    let status = abi::get_header(abi::Map::CallResponseHeaders, ":status")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let body = abi::get_buffer(abi::Buffer::CallResponseBody, 0, body_size).unwrap_or_default();
    flow::CalloutReply::answer(status, body)
}
