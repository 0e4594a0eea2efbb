//! The [`Sink`] over Envoy's ABI: what each effect does in a real Envoy (the meaning of each effect
//! is [`crate::flow::apply`]'s, shared with the fake Envoy of the native tests).

use super::abi::{self, Buffer, Level, Map};
use super::{gauges, metrics, VM};
use crate::flow::apply::{Dispatched, Sink};
use crate::flow::{self, Callout, CalloutReply, Metric, Value};
use crate::reply::LocalReply;

/// Envoy, as one context's effects see it.
pub struct EnvoySink {
    /// Bytes of the request body as Envoy buffers it now (a replacement replaces all of it).
    pub request_body_len: usize,
    /// Bytes of the response chunk of the current callback.
    pub chunk_len: usize,
    /// The root context: its callouts are remembered by token (their answers come to the root).
    pub root: bool,
    /// The root runs request `owner`'s effects ([`super::parked`]): a callout it dispatches is filed
    /// under the root by the SDK, so its token is remembered for that request.
    pub owner: Option<u32>,
}

impl Sink for EnvoySink {
    fn reply(&mut self, reply: LocalReply, details: &'static str) -> bool {
        let headers: Vec<(&str, &str)> = reply
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match abi::send_local_response(reply.status, &headers, &reply.body, details) {
            Ok(()) => true,
            Err(s) => {
                abi::log(
                    Level::Warn,
                    &format!("local reply {} refused by host (status {s})", reply.status),
                );
                false
            }
        }
    }
    fn set_request_header(&mut self, name: &str, value: &str) {
        refused(abi::set_header(Map::RequestHeaders, name, value));
    }
    fn remove_request_header(&mut self, name: &str) {
        refused(abi::remove_header(Map::RequestHeaders, name));
    }
    fn replace_request_body(&mut self, body: Vec<u8>) {
        if refused(abi::set_buffer(
            Buffer::RequestBody,
            0,
            self.request_body_len,
            &body,
        )) {
            self.request_body_len = body.len();
        }
    }
    fn set_response_header(&mut self, name: &str, value: &Value) {
        refused(value.with_str(|v| abi::set_header(Map::ResponseHeaders, name, v)));
    }
    fn remove_response_header(&mut self, name: &str) {
        refused(abi::remove_header(Map::ResponseHeaders, name));
    }
    fn replace_response_chunk(&mut self, bytes: Vec<u8>) {
        refused(abi::set_buffer(
            Buffer::ResponseBody,
            0,
            self.chunk_len,
            &bytes,
        ));
    }
    fn append_response_body(&mut self, bytes: Vec<u8>) {
        // A start at or past the buffer's end appends.
        refused(abi::set_buffer(
            Buffer::ResponseBody,
            u32::MAX as usize,
            0,
            &bytes,
        ));
    }
    fn dispatch(&mut self, callout: Callout) -> Dispatched {
        match dispatch(&callout) {
            Ok(token) => {
                if let Some(id) = self.owner {
                    VM.with(|vm| {
                        vm.borrow_mut().request_callouts.insert(token, id);
                    });
                } else if self.root {
                    VM.with(|vm| {
                        vm.borrow_mut().root_callouts.insert(token, callout.purpose);
                    });
                }
                Dispatched::Sent
            }
            Err(s) => Dispatched::Answered(CalloutReply::refused(s)),
        }
    }
    fn resume(&mut self) {
        if abi::resume_request().is_err() {
            abi::log(Level::Warn, "cannot resume the request");
        }
    }
    fn resume_context(&mut self, id: u32) {
        // A context that went away (client gone) is simply not found.
        if abi::set_effective_context(id).is_ok() {
            let _ = abi::resume_request();
        }
    }
    fn wake_root(&mut self) {
        let queue = VM.with(|vm| vm.try_borrow().ok().and_then(|vm| vm.wake_queue));
        // Without a queue (or when the host refuses) the root's tick sends what waits.
        if let Some(token) = queue {
            if abi::enqueue_shared_queue(token, b"w").is_err() {
                metrics::add(Metric::HostRefused, 1);
            }
        }
    }
    fn audit(&mut self, record: String) {
        let _ = abi::set_property(&["tokengate_audit"], record.as_bytes());
    }
    fn count(&mut self, metric: Metric, n: u64) {
        metrics::add(metric, n);
    }
    fn gauge(&mut self, name: String, value: u64) {
        gauges::set(&name, value);
    }
    fn count_named(&mut self, name: String, n: u64) {
        gauges::add(&name, n);
    }
    fn log(&mut self, level: flow::Level, line: String) {
        abi::log(level_of(level), &line);
    }
}

/// True when the host took a write; counts and logs a refusal.
fn refused(r: Result<(), u32>) -> bool {
    match r {
        Ok(()) => true,
        Err(s) => {
            metrics::add(Metric::HostRefused, 1);
            abi::log(
                Level::Debug,
                &format!("host refused a header or body write (status {s})"),
            );
            false
        }
    }
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
fn dispatch(c: &Callout) -> Result<u32, u32> {
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
pub fn call_reply(body_size: usize) -> CalloutReply {
    let status = abi::get_header(Map::CallResponseHeaders, ":status")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let body = abi::get_buffer(Buffer::CallResponseBody, 0, body_size).unwrap_or_default();
    CalloutReply::answer(status, body)
}
