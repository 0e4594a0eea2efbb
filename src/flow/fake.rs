//! A fake Envoy for the flow's native tests. It drives [`Request`] and [`Worker`] the way Envoy 1.40 does
//! (docs/internals.md, "The request, phase by phase") and turns every rule the flow could break into a test failure:
//!
//! * a pause in the request-headers callback means the body never comes: the request hangs
//!   ([`Violation`]);
//! * request headers are read-only once the body is being read (Envoy answers BadArgument; the SDK's
//!   helpers panic): a header effect outside the headers phase is a violation;
//! * a shared-data write to a missing key ignores its CAS token ([`MemStore`] follows that rule, and
//!   several workers share one store);
//! * a callout that times out or reaches a dead cluster is answered with a synthetic 504 / 503 and an
//!   empty body; an unknown cluster is refused at dispatch;
//! * the upstream may answer before the request body was read.
//!
//! A test builds a [`FakeEnvoy`] from a JSON config, sends requests ([`FakeEnvoy::send`]), answers
//! their callouts, plays the provider's response ([`FakeEnvoy::respond`]) or a client abort, and reads
//! what the client saw, the counters, the logs and the audit record.

use super::apply::{apply, Dispatched, From, Sink};
use super::vm::tick as worker;
use super::{
    Body, Callout, CalloutReply, Cx, Effect, Host, Level, Metric, Next, Purpose, Request, Value,
    Worker,
};
use crate::config::{self, Config};
use crate::reply::LocalReply;
use crate::store::{MemStore, SharedStore};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// An Envoy rule the flow broke.
pub type Violation = String;

/// The host as one callback sees it.
struct View<'a> {
    now: u64,
    store: &'a MemStore,
    props: &'a HashMap<String, Vec<u8>>,
    body: Option<&'a [u8]>,
}

impl Host for View<'_> {
    fn now_ns(&self) -> u64 {
        self.now
    }
    fn store(&self) -> &dyn SharedStore {
        self.store
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.props.get(&path.join(".")).cloned()
    }
    fn body(&self, _which: Body, size: usize) -> Option<Vec<u8>> {
        self.body.map(|b| b.get(..size).unwrap_or(b).to_vec())
    }
}

/// Where a request's callbacks are (what Envoy allows there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    RequestHeaders,
    RequestBody,
    Callout,
    ResponseHeaders,
    ResponseBody,
    Log,
}

/// One request going through the fake Envoy, and what its client and the upstream saw.
pub struct Call {
    /// The flow's request.
    pub req: Request,
    /// Which worker VM it runs on.
    pub worker: usize,
    /// Request headers as the upstream gets them.
    pub headers: Vec<(String, String)>,
    /// Request body as the upstream gets it (after rewrites).
    pub body: Vec<u8>,
    /// The local reply the filter sent, if any.
    pub reply: Option<LocalReply>,
    /// The callout the request waits for.
    pub pending: Option<Callout>,
    /// The request was let go upstream (continued or resumed after the body).
    pub forwarded: bool,
    /// Envoy started the upstream request (the headers phase continued).
    pub upstream_started: bool,
    /// Response headers as the client gets them.
    pub response_headers: Vec<(String, String)>,
    /// Response body as the client gets it.
    pub client_body: Vec<u8>,
    /// The last audit record written.
    pub audit: Option<String>,
    /// How many audit records were written (each one a host call).
    pub audits: u32,
    /// Rules of Envoy the flow broke.
    pub violations: Vec<Violation>,
    /// Held by shaping (waiting for the root's tick).
    pub held: bool,
    /// `on_log` ran.
    pub ended: bool,
}

impl Call {
    /// A response header the client got.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.response_headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The status of the local reply.
    pub fn status(&self) -> Option<u32> {
        self.reply.as_ref().map(|r| r.status)
    }
    /// The local reply's JSON body.
    pub fn reply_json(&self) -> serde_json::Value {
        self.reply
            .as_ref()
            .and_then(|r| serde_json::from_slice(&r.body).ok())
            .unwrap_or(serde_json::Value::Null)
    }
    /// A header of the local reply.
    pub fn reply_header(&self, name: &str) -> Option<&str> {
        self.reply.as_ref().and_then(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        })
    }
    /// A field of the audit record (`decision`, `tenant`, `actual` …).
    pub fn audit_field(&self, field: &str) -> Option<String> {
        let rec = self.audit.as_ref()?;
        rec.split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{field}=")).map(str::to_string))
    }
}

/// A fake Envoy: one shared store, a clock, `n` worker VMs.
pub struct FakeEnvoy {
    /// The configuration.
    pub cfg: Config,
    /// Shared data.
    pub store: MemStore,
    /// The clock (ns).
    pub now: Cell<u64>,
    /// Worker VMs.
    pub workers: Vec<RefCell<Worker>>,
    /// Stream properties (`xds.cluster_name` …).
    pub props: HashMap<String, Vec<u8>>,
    /// Counters.
    pub metrics: RefCell<HashMap<Metric, u64>>,
    /// Logs.
    pub logs: RefCell<Vec<(Level, String)>>,
    /// Gauges, and counters named at run time.
    pub gauges: RefCell<HashMap<String, u64>>,
    /// Clusters Envoy knows (a callout to another is refused at dispatch, as Envoy's BadArgument).
    pub clusters: Vec<String>,
    /// Root callouts dispatched and not answered yet.
    pub root_callouts: RefCell<Vec<Callout>>,
    /// Context ids the root's tick resumed.
    pub resumed: RefCell<Vec<u32>>,
    /// How a shim answers the start-up `PING` (default: 200 `{"PING":[true,"PONG"]}`).
    pub probe_answer: RefCell<(u32, String)>,
    /// Root wakes asked ([`Effect::WakeRoot`]) and not run yet ([`FakeEnvoy::wake`] runs them).
    pub wakes: Cell<u32>,
    /// How long each request body takes to arrive after its headers (ms; the clock moves between the
    /// two phases of [`FakeEnvoy::send`]).
    pub upload_ms: Cell<u64>,
    next_id: Cell<u32>,
}

/// 2026-11-15 00:00:00 UTC, in ns: mid-month, so month arithmetic is not at an edge.
pub const T0: u64 = 1_794_700_800_000_000_000;

impl FakeEnvoy {
    /// A fake Envoy with `workers` VMs and this plugin configuration; panics on a bad config (tests).
    pub fn new(config_json: &str, workers: usize) -> Self {
        let cfg = match config::parse(config_json.as_bytes()) {
            Ok(c) => c,
            Err(e) => panic!("bad test config: {e}"),
        };
        let mut clusters = vec!["provider".to_string()];
        if let Some(q) = &cfg.quota {
            clusters.push(q.cluster.clone());
        }
        if let Some(g) = &cfg.global {
            clusters.push(g.cluster.clone());
        }
        let mut props = HashMap::new();
        props.insert("xds.cluster_name".to_string(), b"provider".to_vec());
        FakeEnvoy {
            cfg,
            store: MemStore::new(),
            now: Cell::new(T0),
            workers: (0..workers.max(1))
                .map(|_| RefCell::new(Worker::default()))
                .collect(),
            props,
            metrics: RefCell::new(HashMap::new()),
            logs: RefCell::new(Vec::new()),
            gauges: RefCell::new(HashMap::new()),
            clusters,
            root_callouts: RefCell::new(Vec::new()),
            resumed: RefCell::new(Vec::new()),
            probe_answer: RefCell::new((200, r#"{"PING":[true,"PONG"]}"#.to_string())),
            wakes: Cell::new(0),
            upload_ms: Cell::new(0),
            next_id: Cell::new(1),
        }
    }

    /// Moves the clock.
    pub fn advance_ms(&self, ms: u64) {
        self.now.set(self.now.get() + ms * 1_000_000);
    }

    /// A counter's value.
    pub fn metric(&self, m: Metric) -> u64 {
        self.metrics.borrow().get(&m).copied().unwrap_or(0)
    }

    /// True when a log line contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.logs.borrow().iter().any(|(_, l)| l.contains(needle))
    }

    /// Runs one flow function of `call` and applies its effects as Envoy would in `phase`.
    fn run(
        &self,
        call: &mut Call,
        phase: Phase,
        body: Option<&[u8]>,
        f: impl FnOnce(&mut Request, &mut Cx) -> Next,
    ) -> Next {
        let mut fx = Vec::new();
        let next = {
            let view = View {
                now: self.now.get(),
                store: &self.store,
                props: &self.props,
                body,
            };
            let mut w = self.workers[call.worker].borrow_mut();
            let mut cx = Cx {
                cfg: &self.cfg,
                host: &view,
                worker: &mut w,
                fx: &mut fx,
            };
            f(&mut call.req, &mut cx)
        };
        self.apply(call, phase, next, fx)
    }

    /// Applies effects as Envoy would in `phase` ([`crate::flow::apply`], with [`CallSink`]); a
    /// callout Envoy refuses at dispatch is answered at once.
    fn apply(&self, call: &mut Call, phase: Phase, next: Next, mut fx: Vec<Effect>) -> Next {
        // As the adapter (src/host/http.rs): a callout's answer and `on_log` resume the stream by
        // asking Envoy; a stream callback by returning Continue.
        let from = if matches!(phase, Phase::Callout | Phase::Log) {
            From::Callout
        } else {
            From::Stream
        };
        // The request goes to `deliver`, the rest of the call to the sink.
        let id = call.req.id();
        let mut req = std::mem::replace(&mut call.req, Request::new(id));
        let worker = call.worker;
        let mut sink = CallSink {
            env: self,
            call,
            phase,
            chunk: None,
            rest: Vec::new(),
        };
        let mut deliver = |_: Purpose, reply: CalloutReply| -> Vec<Effect> {
            self.collect(worker, &mut req, |req, cx| {
                req.on_callout_reply(cx, reply);
                Next::Pause
            })
        };
        let next = apply(&mut sink, from, next, &mut fx, &mut deliver);
        drop(sink);
        call.req = req;
        if phase == Phase::RequestHeaders && next == Next::Pause && call.reply.is_none() {
            call.violations.push(
                "paused in the request-headers phase without a reply: the body never comes".into(),
            );
        }
        next
    }

    /// Runs `f` and returns its effects without applying them (for callbacks nested in `apply`).
    fn collect(
        &self,
        worker: usize,
        req: &mut Request,
        f: impl FnOnce(&mut Request, &mut Cx) -> Next,
    ) -> Vec<Effect> {
        let mut fx = Vec::new();
        let view = View {
            now: self.now.get(),
            store: &self.store,
            props: &self.props,
            body: None,
        };
        let mut w = self.workers[worker].borrow_mut();
        let mut cx = Cx {
            cfg: &self.cfg,
            host: &view,
            worker: &mut w,
            fx: &mut fx,
        };
        f(req, &mut cx);
        fx
    }

    /// A POST of `body` to `path` with `headers` on worker 0 (a `:method` among them replaces POST):
    /// runs the request-headers and body phases.
    pub fn send(&self, path: &str, headers: &[(&str, &str)], body: &str) -> Call {
        self.send_on(0, path, headers, body)
    }

    /// [`FakeEnvoy::send`] on worker `w`.
    pub fn send_on(&self, w: usize, path: &str, headers: &[(&str, &str)], body: &str) -> Call {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let mut hs: Vec<(String, String)> = vec![
            (":method".into(), "POST".into()),
            (":path".into(), path.into()),
            (":authority".into(), "llm".into()),
        ];
        // A pseudo-header given (`:method`, `:path`) replaces the default one.
        hs.retain(|(k, _)| !headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(k)));
        hs.extend(
            headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string())),
        );
        if !body.is_empty() && !hs.iter().any(|(k, _)| k == "content-length") {
            hs.push(("content-length".into(), body.len().to_string()));
        }
        let mut call = Call {
            req: Request::new(id),
            worker: w,
            headers: hs.clone(),
            body: body.as_bytes().to_vec(),
            reply: None,
            pending: None,
            forwarded: false,
            upstream_started: false,
            response_headers: Vec::new(),
            client_body: Vec::new(),
            audit: None,
            audits: 0,
            violations: Vec::new(),
            held: false,
            ended: false,
        };
        let eos = body.is_empty();
        let next = self.run(&mut call, Phase::RequestHeaders, None, |req, cx| {
            req.on_request_headers(cx, &hs, eos)
        });
        if call.reply.is_some() {
            return call;
        }
        call.upstream_started = next == Next::Continue;
        if eos {
            call.forwarded = next == Next::Continue;
            call.held = call.req.is_held();
            return call;
        }
        self.advance_ms(self.upload_ms.get());
        let sent = body.as_bytes().to_vec();
        let next = self.run(&mut call, Phase::RequestBody, Some(&sent), |req, cx| {
            req.on_request_body(cx, sent.len(), true)
        });
        if call.reply.is_none() && next == Next::Continue {
            call.forwarded = true;
        }
        call.held = call.req.is_held();
        call
    }

    /// Answers the callout `call` waits for.
    pub fn reply(&self, call: &mut Call, status: u32, body: &str) {
        if call.pending.take().is_none() {
            call.violations.push("reply to a callout never made".into());
        }
        let reply = CalloutReply::answer(status, body.as_bytes().to_vec());
        self.run(call, Phase::Callout, None, |req, cx| {
            req.on_callout_reply(cx, reply);
            Next::Pause
        });
        call.held = call.req.is_held();
    }

    /// The callout times out: Envoy answers 504 with an empty body.
    pub fn time_out(&self, call: &mut Call) {
        self.reply(call, 504, "");
    }

    /// The shim's cluster has no healthy host: Envoy answers 503 with an empty body.
    pub fn dead_shim(&self, call: &mut Call) {
        self.reply(call, 503, "");
    }

    /// The provider answers `status` with `headers` and the body in `chunks`; then the stream ends
    /// (`on_log`). The client's view is recorded in `call`.
    pub fn respond(&self, call: &mut Call, status: u32, headers: &[(&str, &str)], chunks: &[&str]) {
        self.respond_partly(call, status, headers, chunks, true);
        self.end(call);
    }

    /// Response headers and chunks; `complete`: the last chunk ends the stream.
    pub fn respond_partly(
        &self,
        call: &mut Call,
        status: u32,
        headers: &[(&str, &str)],
        chunks: &[&str],
        complete: bool,
    ) {
        if call.reply.is_some() {
            call.violations
                .push("the upstream answered a request the filter answered".into());
            return;
        }
        let mut hs: Vec<(String, String)> = vec![(":status".into(), status.to_string())];
        hs.extend(
            headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string())),
        );
        call.response_headers = hs.clone();
        let eos = chunks.is_empty() && complete;
        self.run(call, Phase::ResponseHeaders, None, |req, cx| {
            req.on_response_headers(cx, &hs, eos)
        });
        for (i, chunk) in chunks.iter().enumerate() {
            let last = complete && i + 1 == chunks.len();
            self.chunk(call, chunk.as_bytes(), last);
        }
    }

    /// One response chunk.
    pub fn chunk(&self, call: &mut Call, chunk: &[u8], end_of_stream: bool) {
        let data = chunk.to_vec();
        let mut fx = Vec::new();
        {
            let view = View {
                now: self.now.get(),
                store: &self.store,
                props: &self.props,
                body: Some(&data),
            };
            let mut w = self.workers[call.worker].borrow_mut();
            let mut cx = Cx {
                cfg: &self.cfg,
                host: &view,
                worker: &mut w,
                fx: &mut fx,
            };
            call.req
                .on_response_body(&mut cx, data.len(), end_of_stream);
        }
        let id = call.req.id();
        let mut req = std::mem::replace(&mut call.req, Request::new(id));
        let worker = call.worker;
        let mut sink = CallSink {
            env: self,
            call,
            phase: Phase::ResponseBody,
            chunk: None,
            rest: Vec::new(),
        };
        let mut deliver = |_: Purpose, reply: CalloutReply| -> Vec<Effect> {
            self.collect(worker, &mut req, |req, cx| {
                req.on_callout_reply(cx, reply);
                Next::Pause
            })
        };
        apply(
            &mut sink,
            From::Stream,
            Next::Continue,
            &mut fx,
            &mut deliver,
        );
        let (out, rest) = (
            sink.chunk.take().unwrap_or(data),
            std::mem::take(&mut sink.rest),
        );
        drop(sink);
        call.req = req;
        call.client_body.extend(out);
        call.client_body.extend(rest);
    }

    /// The stream ends (`on_log`): after a response, or a client abort at any point.
    pub fn end(&self, call: &mut Call) {
        if call.ended {
            return;
        }
        call.ended = true;
        // As the adapter (src/host/http.rs): `on_log` only when the flow says it has work there.
        if !call.req.has_end_work() {
            return;
        }
        self.run(call, Phase::Log, None, |req, cx| {
            req.on_log(cx);
            Next::Continue
        });
    }

    /// The root's tick on worker `w`: held requests due are resumed (their ids are recorded in
    /// `resumed`), settlements and credits are dispatched (`root_callouts`).
    pub fn tick(&self, w: usize) {
        self.root_call(w, worker::on_tick);
    }

    /// Envoy tears down worker `w`'s plugin (its root context's `on_done`).
    pub fn done(&self, w: usize) {
        self.root_call(w, worker::on_done);
    }

    /// Runs a root-context callback of worker `w` and applies its effects.
    fn root_call(&self, w: usize, f: impl FnOnce(&mut Cx)) {
        let mut fx = Vec::new();
        {
            let view = View {
                now: self.now.get(),
                store: &self.store,
                props: &self.props,
                body: None,
            };
            let mut wk = self.workers[w].borrow_mut();
            let mut cx = Cx {
                cfg: &self.cfg,
                host: &view,
                worker: &mut wk,
                fx: &mut fx,
            };
            f(&mut cx);
        }
        self.apply_root(w, fx);
    }

    fn apply_root(&self, w: usize, mut fx: Vec<Effect>) {
        let mut sink = RootSink { env: self, w };
        let mut deliver = |purpose, reply| self.root_reply_fx(w, purpose, reply);
        apply(
            &mut sink,
            From::Callout,
            Next::Continue,
            &mut fx,
            &mut deliver,
        );
    }

    fn root_reply_fx(&self, w: usize, purpose: Purpose, reply: CalloutReply) -> Vec<Effect> {
        let mut fx = Vec::new();
        let view = View {
            now: self.now.get(),
            store: &self.store,
            props: &self.props,
            body: None,
        };
        let mut wk = self.workers[w].borrow_mut();
        let mut cx = Cx {
            cfg: &self.cfg,
            host: &view,
            worker: &mut wk,
            fx: &mut fx,
        };
        worker::on_callout_reply(&mut cx, purpose, reply);
        fx
    }

    /// Answers the oldest root callout of worker `w` with `status` and `body`; returns it.
    pub fn reply_root(&self, w: usize, status: u32, body: &str) -> Option<Callout> {
        let c = {
            let mut rc = self.root_callouts.borrow_mut();
            if rc.is_empty() {
                return None;
            }
            rc.remove(0)
        };
        let fx = self.root_reply_fx(
            w,
            c.purpose,
            CalloutReply::answer(status, body.as_bytes().to_vec()),
        );
        self.apply_root(w, fx);
        Some(c)
    }

    /// The root of worker `w` runs its wake (`on_queue_ready`): batched reservations are sent.
    pub fn wake(&self, w: usize) {
        self.wakes.set(0);
        self.root_call(w, worker::on_wake);
    }

    /// The root of worker `w` continues the requests whose batched reservations answered, each in its
    /// own context (as `src/host/parked.rs`), among `calls`; returns how many it continued. A request
    /// not among them is gone: what was kept for it is dropped.
    pub fn continue_ready(&self, w: usize, calls: &mut [&mut Call]) -> usize {
        let ready = std::mem::take(&mut self.workers[w].borrow_mut().batch.ready);
        let mut n = 0;
        for id in ready {
            match calls.iter_mut().find(|c| c.req.id() == id && !c.ended) {
                Some(call) => {
                    n += 1;
                    self.run(call, Phase::Callout, None, |req, cx| {
                        req.on_callout_reply(cx, CalloutReply::answer(0, Vec::new()));
                        Next::Pause
                    });
                    call.held = call.req.is_held();
                }
                None => self.workers[w].borrow_mut().batch.discard(id),
            }
        }
        n
    }

    /// Releases a held request after the tick resumed it (what Envoy does on `continue_stream`).
    pub fn release(&self, call: &mut Call) {
        if self.resumed.borrow().contains(&call.req.id()) {
            call.forwarded = true;
            call.held = false;
        }
    }
}

/// Envoy as one request's callback sees its effects, checking the rules the flow must keep.
struct CallSink<'a> {
    env: &'a FakeEnvoy,
    call: &'a mut Call,
    phase: Phase,
    /// The chunk as the client gets it, once replaced.
    chunk: Option<Vec<u8>>,
    /// Bytes appended after the chunk.
    rest: Vec<u8>,
}

impl Sink for CallSink<'_> {
    fn reply(&mut self, reply: LocalReply, _details: &'static str) -> bool {
        let call = &mut *self.call;
        if call.reply.is_some() {
            call.violations.push("two local replies".into());
        }
        if !call.response_headers.is_empty() {
            call.violations
                .push("a local reply after the response started".into());
        }
        call.reply = Some(reply);
        true
    }
    fn set_request_header(&mut self, k: &str, v: &str) {
        let call = &mut *self.call;
        if self.phase != Phase::RequestHeaders {
            call.violations
                .push(format!("request header {k} set in {:?}", self.phase));
        }
        call.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(k));
        call.headers.push((k.to_string(), v.to_string()));
    }
    fn remove_request_header(&mut self, k: &str) {
        let call = &mut *self.call;
        if self.phase != Phase::RequestHeaders {
            call.violations
                .push(format!("request header {k} removed in {:?}", self.phase));
        }
        call.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(k));
    }
    fn replace_request_body(&mut self, b: Vec<u8>) {
        let call = &mut *self.call;
        if call.forwarded {
            call.violations
                .push("request body replaced after it was sent".into());
        }
        call.body = b;
    }
    fn set_response_header(&mut self, k: &str, v: &Value) {
        let call = &mut *self.call;
        if self.phase != Phase::ResponseHeaders {
            call.violations
                .push(format!("response header {k} set in {:?}", self.phase));
        }
        call.response_headers
            .retain(|(n, _)| !n.eq_ignore_ascii_case(k));
        call.response_headers.push((k.to_string(), v.to_text()));
    }
    fn remove_response_header(&mut self, k: &str) {
        self.call
            .response_headers
            .retain(|(n, _)| !n.eq_ignore_ascii_case(k));
    }
    fn replace_response_chunk(&mut self, bytes: Vec<u8>) {
        if self.phase != Phase::ResponseBody {
            self.call
                .violations
                .push("a response body effect outside a body callback".into());
        }
        self.chunk = Some(bytes);
    }
    fn append_response_body(&mut self, bytes: Vec<u8>) {
        if self.phase != Phase::ResponseBody {
            self.call
                .violations
                .push("a response body effect outside a body callback".into());
        }
        self.rest.extend(bytes);
    }
    fn dispatch(&mut self, c: Callout) -> Dispatched {
        if !self.env.clusters.contains(&c.cluster) {
            // Envoy: BadArgument at dispatch; answered at once.
            return Dispatched::Answered(CalloutReply::refused(2));
        }
        if self.call.pending.is_some() {
            self.call.violations.push("two callouts in flight".into());
        }
        self.call.pending = Some(c);
        Dispatched::Sent
    }
    fn resume(&mut self) {
        if self.call.reply.is_none() {
            self.call.forwarded = true;
        }
    }
    fn resume_context(&mut self, _id: u32) {
        self.call
            .violations
            .push("ResumeContext from a request".into());
    }
    fn wake_root(&mut self) {
        self.env.wakes.set(self.env.wakes.get() + 1);
    }
    fn audit(&mut self, rec: String) {
        self.call.audit = Some(rec);
        self.call.audits += 1;
    }
    fn count(&mut self, m: Metric, n: u64) {
        *self.env.metrics.borrow_mut().entry(m).or_insert(0) += n;
    }
    fn gauge(&mut self, name: String, v: u64) {
        self.env.gauges.borrow_mut().insert(name, v);
    }
    fn count_named(&mut self, name: String, n: u64) {
        *self.env.gauges.borrow_mut().entry(name).or_insert(0) += n;
    }
    fn log(&mut self, level: Level, msg: String) {
        self.env.logs.borrow_mut().push((level, msg));
    }
}

/// Envoy as a root context's callback sees its effects: a probe of a known shim is answered at once,
/// as a healthy Webdis does; other callouts wait in `root_callouts`.
struct RootSink<'a> {
    env: &'a FakeEnvoy,
    #[allow(dead_code)]
    w: usize,
}

impl Sink for RootSink<'_> {
    fn reply(&mut self, _: LocalReply, _: &'static str) -> bool {
        true
    }
    fn set_request_header(&mut self, _: &str, _: &str) {}
    fn remove_request_header(&mut self, _: &str) {}
    fn replace_request_body(&mut self, _: Vec<u8>) {}
    fn set_response_header(&mut self, _: &str, _: &Value) {}
    fn remove_response_header(&mut self, _: &str) {}
    fn replace_response_chunk(&mut self, _: Vec<u8>) {}
    fn append_response_body(&mut self, _: Vec<u8>) {}
    fn dispatch(&mut self, c: Callout) -> Dispatched {
        if !self.env.clusters.contains(&c.cluster) {
            return Dispatched::Answered(CalloutReply::refused(2));
        }
        if c.purpose == Purpose::Probe {
            let (status, body) = self.env.probe_answer.borrow().clone();
            return Dispatched::Answered(CalloutReply::answer(status, body.into_bytes()));
        }
        self.env.root_callouts.borrow_mut().push(c);
        Dispatched::Sent
    }
    fn resume(&mut self) {}
    fn resume_context(&mut self, id: u32) {
        self.env.resumed.borrow_mut().push(id);
    }
    fn wake_root(&mut self) {
        self.env.wakes.set(self.env.wakes.get() + 1);
    }
    fn audit(&mut self, _: String) {}
    fn count(&mut self, m: Metric, n: u64) {
        *self.env.metrics.borrow_mut().entry(m).or_insert(0) += n;
    }
    fn gauge(&mut self, name: String, v: u64) {
        self.env.gauges.borrow_mut().insert(name, v);
    }
    fn count_named(&mut self, name: String, n: u64) {
        *self.env.gauges.borrow_mut().entry(name).or_insert(0) += n;
    }
    fn log(&mut self, level: Level, msg: String) {
        self.env.logs.borrow_mut().push((level, msg));
    }
}
