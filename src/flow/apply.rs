//! Applying effects: the one place that says what each [`Effect`] means, used by the host adapter
//! (`crate::host`, over Envoy's ABI) and by the fake Envoy of the native tests alike, so that the tests
//! exercise the same application as Envoy gets. Each does only what its [`Sink`] is asked.
//!
//! * A local reply pauses the stream (or, when the host refuses it, lets it go on).
//! * A resume continues the stream: from a stream callback it is that callback returning `Continue`;
//!   from a callout's answer (or a timer) the host is asked to resume.
//! * A callout the host answers at once (its dispatch refused, or a fake's immediate answer) is
//!   delivered at once through `deliver`, and the effects of that answer are applied after the ones
//!   already queued.

use super::effect::{Callout, CalloutReply, Effect, Level, Next, Purpose, Value};
use super::metric::Metric;
use crate::reply::LocalReply;

/// What a dispatch came to.
pub enum Dispatched {
    /// Sent; its answer comes later.
    Sent,
    /// Answered at once (the host refused it: [`CalloutReply::refused`]).
    Answered(CalloutReply),
}

/// Where the effects of a callback come from: what a resume means there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// A stream callback: a resume is the callback returning `Continue`.
    Stream,
    /// A callout's answer or the root's tick: a resume asks the host to continue the stream.
    Callout,
}

/// What the host does for each effect.
pub trait Sink {
    /// Sends a local reply; false when the host refused it.
    fn reply(&mut self, reply: LocalReply, details: &'static str) -> bool;
    /// Sets a request header (headers phase only).
    fn set_request_header(&mut self, name: &str, value: &str);
    /// Removes a request header (headers phase only).
    fn remove_request_header(&mut self, name: &str);
    /// Replaces the whole buffered request body.
    fn replace_request_body(&mut self, body: Vec<u8>);
    /// Sets a response header.
    fn set_response_header(&mut self, name: &str, value: &Value);
    /// Removes a response header.
    fn remove_response_header(&mut self, name: &str);
    /// Replaces the current response chunk.
    fn replace_response_chunk(&mut self, bytes: Vec<u8>);
    /// Appends after the current response chunk.
    fn append_response_body(&mut self, bytes: Vec<u8>);
    /// Sends a callout.
    fn dispatch(&mut self, callout: Callout) -> Dispatched;
    /// Asks the host to continue this paused stream.
    fn resume(&mut self);
    /// Asks the host to continue another context's paused stream (a hold released by the tick).
    fn resume_context(&mut self, id: u32);
    /// Asks the host to run the root context soon ([`Effect::WakeRoot`]).
    fn wake_root(&mut self);
    /// Writes the audit record.
    fn audit(&mut self, record: String);
    /// Adds to a counter.
    fn count(&mut self, metric: Metric, n: u64);
    /// Sets a gauge.
    fn gauge(&mut self, name: String, value: u64);
    /// Adds to a counter named at run time.
    fn count_named(&mut self, name: String, n: u64);
    /// Logs a line.
    fn log(&mut self, level: Level, line: String);
}

/// Applies `fx` in order to `sink`, leaving it empty (its capacity is kept for the next callback);
/// `next`: what the callback returned. `deliver` hands a callout's immediate answer back to the flow
/// and returns its effects. Returns what the callback returns to the host.
pub fn apply(
    sink: &mut dyn Sink,
    from: From,
    mut next: Next,
    fx: &mut Vec<Effect>,
    deliver: &mut dyn FnMut(Purpose, CalloutReply) -> Vec<Effect>,
) -> Next {
    let mut i = 0;
    while let Some(slot) = fx.get_mut(i) {
        i += 1;
        // Taken out in place (no shifting): `Resume` is only a placeholder here.
        let e = std::mem::replace(slot, Effect::Resume);
        match e {
            Effect::Reply { reply, details } => {
                next = if sink.reply(reply, details) {
                    Next::Pause
                } else {
                    Next::Continue
                };
            }
            Effect::SetRequestHeader(k, v) => sink.set_request_header(&k, &v),
            Effect::RemoveRequestHeader(k) => sink.remove_request_header(&k),
            Effect::ReplaceRequestBody(b) => sink.replace_request_body(b),
            Effect::SetResponseHeader(k, v) => sink.set_response_header(&k, &v),
            Effect::RemoveResponseHeader(k) => sink.remove_response_header(&k),
            Effect::ReplaceResponseChunk(b) => sink.replace_response_chunk(b),
            Effect::AppendResponseBody(b) => sink.append_response_body(b),
            Effect::Dispatch(c) => {
                let purpose = c.purpose;
                if let Dispatched::Answered(reply) = sink.dispatch(c) {
                    let more = deliver(purpose, reply);
                    fx.extend(more);
                }
            }
            Effect::Resume => match from {
                From::Stream => next = Next::Continue,
                From::Callout => sink.resume(),
            },
            Effect::ResumeContext(id) => sink.resume_context(id),
            Effect::WakeRoot => sink.wake_root(),
            Effect::Audit(rec) => sink.audit(rec),
            Effect::Count(m, n) => sink.count(m, n),
            Effect::Gauge(name, v) => sink.gauge(name, v),
            Effect::CountNamed(name, n) => sink.count_named(name, n),
            Effect::Log(level, msg) => sink.log(level, msg),
        }
    }
    fx.clear();
    next
}
