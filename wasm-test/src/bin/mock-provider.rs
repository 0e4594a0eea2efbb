//! `mock-provider`: a deterministic fake of an OpenAI-compatible LLM provider (plus Anthropic
//! `/v1/messages`) that the integration tests put behind Envoy.
//!
//! ```text
//! mock-provider --port 0        # first stdout line: "listening on 127.0.0.1:<port>"
//! ```
//!
//! HTTP/1.1 on 127.0.0.1 only, one thread per connection, keep-alive, `content-length` or chunked
//! request bodies (Envoy sends chunked when the filter removed `content-length`).
//!
//! Endpoints (POST): `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/responses`,
//! `/v1/messages` (matched on the path suffix, query ignored, like the filter; Azure's
//! `/openai/deployments/{d}/chat/completions` is chat). The other families, each in its own shape:
//! - Gemini API / Vertex AI `…/models/{m}:generateContent` (candidates + `usageMetadata`) and
//!   `:streamGenerateContent` (`?alt=sse`: SSE events ending with a blank line; without it a streamed JSON
//!   array), cumulative `usageMetadata` on every chunk, `finishReason` on the last; errors
//!   `{"error":{"code","message","status"}}`. Claude on Vertex AI (`…/publishers/anthropic/models/
//!   {m}:rawPredict` / `:streamRawPredict`) answers as `/v1/messages`.
//! - Bedrock `/model/{id}/converse` (`output`, `stopReason`, `usage`), `/converse-stream` (the AWS
//!   event stream: `messageStart`, `contentBlockDelta`…, `contentBlockStop`, `messageStop`,
//!   `metadata` with `usage`; prelude and message CRC32s), `/invoke` (an Anthropic body when the
//!   request has `anthropic_version`, else Llama's shape; `x-amzn-bedrock-input-token-count` /
//!   `-output-token-count` headers) and `/invoke-with-response-stream` (`chunk` events whose base64
//!   `bytes` are the model's events, the last with `amazon-bedrock-invocationMetrics`); request id in
//!   `x-amzn-requestid`, errors `{"message"}` with `x-amzn-errortype`.
//!
//! `GET /healthz` answers `{"ok":true}`; any other path answers 200 `{"ok":true,"path":<path>}`.
//!
//! Usage is a pure function of the request so tests can predict it:
//! - `prompt_tokens` = max(1, bytes of all string leaves under `messages`/`prompt`/`input`/`system`/
//!   `instructions`/`contents`/`systemInstruction`/`inputText`, not counting values of `role`/`type`
//!   keys, / 4)
//! - `completion_tokens` = the request limit (`max_tokens`, `max_completion_tokens`,
//!   `max_output_tokens`, `generationConfig.maxOutputTokens`, `inferenceConfig.maxTokens` or
//!   `max_new_tokens`, `max_gen_len`, `textGenerationConfig.maxTokenCount`, else 16); header `x-mock-completion-tokens: N` replaces it, but never
//!   exceeds an explicit request limit (as a real provider). Embeddings have no completion tokens.
//! - a Messages request with `stream_options`, or a Responses request with
//!   `stream_options.include_usage`, is refused with 400 (as the real APIs refuse fields they lack)
//! - a Responses request with `background: true` (not streamed) is answered as OpenAI does: status
//!   `queued`, no output, `usage: null` (the ledger still counts what it will generate).
//!
//! Failure injection by request header:
//! - `x-mock-status: 503`        answer that status with an OpenAI-shaped error body
//! - `x-mock-retry-after: 7`     with a 429 status: add `retry-after: 7`
//! - `x-mock-delay-ms: 500`      sleep before answering
//! - `x-mock-reset: 1`           close the TCP connection without answering
//! - `x-mock-cut-after: N`       stream: send N SSE events then close without the final chunk
//!   (non-stream: send the headers and half the body, then close)
//! - `x-mock-chunk-delay-ms: N`  pause between SSE events (default 5)
//! - `x-mock-completion-tokens: N`  see above
//! - `x-mock-id: name`           echoed as response header `x-mock-served-by`
//! - `x-mock-tenant: t`, `x-mock-tag: id`   the ledger's tenant and request id (see below)
//! - `x-mock-gzip: 1`            gzip the LLM answer (JSON or SSE) even without `accept-encoding: gzip`
//! - `x-mock-no-output-count: 1` the final usage without `completion_tokens` / `output_tokens`
//!
//! Like real providers, LLM answers are gzip-encoded (`content-encoding: gzip`) when the request's
//! `accept-encoding` lists gzip (stored deflate blocks: a valid gzip stream, one block per SSE event).
//!
//! Every answer carries `x-mock-port: <port>`, and like the real providers a request id:
//! `request-id: mock-req-<n>` on `/messages` paths (Anthropic), `x-request-id: mock-req-<n>` elsewhere.
//! Errors injected on `/messages` paths have Anthropic's shape (`{"type":"error","error":{…}}`).
//!
//! Provider rate-limit headers on demand (LLM answers, either family's names):
//! - `x-mock-ratelimit-tokens: L,R`    the token trio: limit L, remaining R, reset in 6 s
//! - `x-mock-ratelimit-requests: L,R`  the request trio, likewise
//!
//! Recording: `GET /_mock/requests` returns a JSON array of `{method, path, headers, body}` for every
//! complete request (except `/_mock/*`) since start or the last `POST /_mock/reset`.
//! `GET /_mock/incomplete` lists requests whose headers arrived but whose body never completed
//! (the client or Envoy reset the stream): a request rejected by the filter in the headers phase
//! appears in neither list, one rejected in the body phase may appear here.
//!
//! Served-usage ledger: every LLM answer (JSON or SSE, complete or cut, and resets and error statuses
//! with 0 tokens) is recorded for the tenant of `x-mock-tenant` (else `x-tenant-id`, else `-`) with the
//! request's `x-mock-tag` (a test's own id for the request). Tokens served: prompt + the completion
//! tokens sent — for a stream, those in the content events written whole (a cut stream counts what it
//! had streamed); for JSON, the whole completion (the provider generated it even when the body is cut).
//! `GET /_mock/ledger` returns `{"served", "tokens", "tenants": {<tenant>: {requests, complete, cut,
//! reset, error, tokens, prompt_tokens, output_tokens}}, "requests": [{tenant, tag, path, stream,
//! outcome, cut_by, status, prompt, completion, output_sent, content_bytes, body_bytes, tokens}]}`
//! (`outcome`: complete | cut | reset | error; `cut_by`: injected | peer); `POST /_mock/ledger/reset`
//! clears it (`/_mock/reset` does not).
//!
//! Requests at the provider at once: an LLM request carrying `x-mock-concurrency: <group>[,<group>…]`
//! counts in each group from the moment its body is complete (what a provider starts working on; a request Envoy
//! reset before its body ended never does) until the last bytes of its answer are about to be written
//! (recorded first, so that nothing Envoy does once it has them can come before) or its peer has gone (a
//! thread waits on the connection without reading from it, so a client abort that makes Envoy close the
//! upstream connection ends the request when the mock sees the close, not at its next write).
//! `GET /_mock/concurrency` returns `{<group>: {"active", "max", "total", "spans"}}` (`spans`: per
//! request `[from_us, to_us or null, "answered" | "gone", <x-mock-tag>]`, microseconds since the Unix
//! epoch); `POST /_mock/concurrency/reset` clears it.

use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Requests seen by this process, shared by every connection thread.
#[derive(Default)]
struct Recorder {
    complete: Vec<Value>,
    incomplete: Vec<Value>,
    /// Answers given (numbers the request ids).
    served: u64,
    /// Usage served per LLM answer (`/_mock/ledger`).
    ledger: Vec<Served>,
    /// Requests at the provider at once, per `x-mock-concurrency` group (`/_mock/concurrency`).
    concurrency: std::collections::BTreeMap<String, Gauge>,
}

/// One `x-mock-concurrency` group: requests being answered now, the most at once, how many ever, and
/// each request's time at the mock.
#[derive(Default, Clone)]
struct Gauge {
    active: u64,
    max: u64,
    total: u64,
    /// Per request: when its body was complete, when it ended (`None`: not yet), how (`answered`: its
    /// last bytes were about to be written, or a write failed; `gone`: the peer closed the connection
    /// first), and its `x-mock-tag`.
    spans: Vec<Span>,
}

/// One request of a [`Gauge`]; times in microseconds since the Unix epoch (so that a test can compare
/// them with what its clients saw).
#[derive(Clone)]
struct Span {
    from: u64,
    to: Option<u64>,
    how: &'static str,
    tag: String,
}

/// Now, in microseconds since the Unix epoch.
fn micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

type Shared = Arc<Mutex<Recorder>>;

/// A parsed HTTP/1.1 request.
struct Request {
    method: String,
    path: String,
    /// Lowercased names, in arrival order.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn header_num(&self, name: &str) -> Option<u64> {
        self.header(name).and_then(|v| v.trim().parse().ok())
    }

    fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    fn to_record(&self) -> Value {
        let mut headers = Map::new();
        for (k, v) in &self.headers {
            headers.insert(k.clone(), Value::String(v.clone()));
        }
        json!({
            "method": self.method,
            "path": self.path,
            "headers": headers,
            "body": String::from_utf8_lossy(&self.body),
        })
    }
}

enum ReadOutcome {
    Request(Request),
    /// Clean end of connection before a new request started.
    Closed,
    /// Headers arrived but the body did not complete.
    Incomplete(Request),
}

fn main() {
    let mut port: u16 = 0;
    // Loopback by default; a container (docker-compose) passes `--host 0.0.0.0`.
    let mut host = String::from("127.0.0.1");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--port" => {
                port = match args.next().and_then(|p| p.parse().ok()) {
                    Some(p) => p,
                    None => fail("--port needs a number"),
                }
            }
            "--host" => {
                host = match args.next() {
                    Some(h) => h,
                    None => fail("--host needs an address"),
                }
            }
            "-h" | "--help" => {
                println!("usage: mock-provider [--host ADDR] --port N   (0 picks a free port; host 127.0.0.1)");
                return;
            }
            other => fail(&format!("unknown argument {other}")),
        }
    }
    let listener = match TcpListener::bind((host.as_str(), port)) {
        Ok(l) => l,
        Err(e) => fail(&format!("bind {host}:{port}: {e}")),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
    println!("listening on {host}:{port}");
    let _ = std::io::stdout().flush();

    let shared: Shared = Arc::new(Mutex::new(Recorder::default()));
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        let shared = shared.clone();
        thread::spawn(move || serve_connection(stream, port, shared));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("mock-provider: {msg}");
    std::process::exit(2);
}

fn serve_connection(stream: TcpStream, port: u16, shared: Shared) {
    let _ = stream.set_nodelay(true);
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut out = stream;
    loop {
        let req = match read_request(&mut reader, &mut out) {
            ReadOutcome::Request(r) => r,
            ReadOutcome::Closed => return,
            ReadOutcome::Incomplete(r) => {
                if !r.path.starts_with("/_mock/") {
                    lock(&shared).incomplete.push(r.to_record());
                }
                return;
            }
        };
        let keep = handle(&req, &mut out, port, &shared);
        if !keep || req.wants_close() {
            let _ = out.shutdown(Shutdown::Both);
            return;
        }
    }
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Recorder> {
    match shared.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn read_line(reader: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end_matches(['\r', '\n']).to_string()),
    }
}

fn read_request(reader: &mut BufReader<TcpStream>, out: &mut TcpStream) -> ReadOutcome {
    // Request line (skip stray empty lines between pipelined requests).
    let line = loop {
        match read_line(reader) {
            None => return ReadOutcome::Closed,
            Some(l) if l.is_empty() => continue,
            Some(l) => break l,
        }
    };
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("/").to_string();
    let mut req = Request {
        method,
        path,
        headers: Vec::new(),
        body: Vec::new(),
    };
    loop {
        match read_line(reader) {
            None => return ReadOutcome::Incomplete(req),
            Some(l) if l.is_empty() => break,
            Some(l) => {
                if let Some((k, v)) = l.split_once(':') {
                    req.headers
                        .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                }
            }
        }
    }
    if req
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    {
        let _ = out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    let chunked = req
        .header("transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        loop {
            let Some(size_line) = read_line(reader) else {
                return ReadOutcome::Incomplete(req);
            };
            let size_hex = size_line.split(';').next().unwrap_or("").trim();
            let Ok(size) = usize::from_str_radix(size_hex, 16) else {
                return ReadOutcome::Incomplete(req);
            };
            if size == 0 {
                // Trailers until the empty line.
                loop {
                    match read_line(reader) {
                        None => return ReadOutcome::Incomplete(req),
                        Some(l) if l.is_empty() => break,
                        Some(_) => {}
                    }
                }
                break;
            }
            let mut buf = vec![0u8; size];
            if reader.read_exact(&mut buf).is_err() {
                return ReadOutcome::Incomplete(req);
            }
            req.body.extend_from_slice(&buf);
            let mut crlf = [0u8; 2];
            if reader.read_exact(&mut crlf).is_err() {
                return ReadOutcome::Incomplete(req);
            }
        }
    } else if let Some(len) = req.header_num("content-length") {
        let mut buf = vec![0u8; len as usize];
        if reader.read_exact(&mut buf).is_err() {
            return ReadOutcome::Incomplete(req);
        }
        req.body = buf;
    }
    ReadOutcome::Request(req)
}

/// Writes the answer. Returns false when the connection must be closed.
fn handle(req: &Request, out: &mut TcpStream, port: u16, shared: &Shared) -> bool {
    let bare_path = req.path.split('?').next().unwrap_or("");
    let mut extra: Vec<(String, String)> = vec![("x-mock-port".into(), port.to_string())];
    let anthropic = bare_path.ends_with("/messages");
    let id = {
        let mut rec = lock(shared);
        rec.served += 1;
        format!("mock-req-{}", rec.served)
    };
    let id_header = match Endpoint::of(bare_path).map(Endpoint::family) {
        Some(Family::Bedrock) => "x-amzn-requestid",
        _ if anthropic => "request-id",
        _ => "x-request-id",
    };
    extra.push((id_header.into(), id));
    if let Some(id) = req.header("x-mock-id") {
        extra.push(("x-mock-served-by".into(), id.to_string()));
    }

    // Control endpoints: not recorded, no failure injection.
    match (req.method.as_str(), bare_path) {
        ("GET", "/_mock/requests") => {
            let body = Value::Array(lock(shared).complete.clone()).to_string();
            return write_response(out, 200, "application/json", &extra, body.as_bytes());
        }
        ("GET", "/_mock/incomplete") => {
            let body = Value::Array(lock(shared).incomplete.clone()).to_string();
            return write_response(out, 200, "application/json", &extra, body.as_bytes());
        }
        ("GET", "/_mock/ledger") => {
            let body = ledger_json(&lock(shared).ledger).to_string();
            return write_response(out, 200, "application/json", &extra, body.as_bytes());
        }
        ("POST", "/_mock/ledger/reset") => {
            lock(shared).ledger.clear();
            return write_response(out, 200, "application/json", &extra, b"{\"ok\":true}");
        }
        ("GET", "/_mock/concurrency") => {
            let body: Map<String, Value> = lock(shared)
                .concurrency
                .iter()
                .map(|(k, g)| {
                    let spans: Vec<Value> = g
                        .spans
                        .iter()
                        .map(|s| json!([s.from, s.to, s.how, s.tag]))
                        .collect();
                    (
                        k.clone(),
                        json!({"active": g.active, "max": g.max, "total": g.total, "spans": spans}),
                    )
                })
                .collect();
            let body = Value::Object(body).to_string();
            return write_response(out, 200, "application/json", &extra, body.as_bytes());
        }
        ("POST", "/_mock/concurrency/reset") => {
            lock(shared).concurrency.clear();
            return write_response(out, 200, "application/json", &extra, b"{\"ok\":true}");
        }
        ("POST", "/_mock/reset") => {
            let mut rec = lock(shared);
            rec.complete.clear();
            rec.incomplete.clear();
            drop(rec);
            return write_response(out, 200, "application/json", &extra, b"{\"ok\":true}");
        }
        _ => {}
    }
    lock(shared).complete.push(req.to_record());
    let llm = req.method == "POST" && Endpoint::of(bare_path).is_some();
    let mut served = Served::of(req, bare_path);
    let active = req
        .header("x-mock-concurrency")
        .filter(|_| llm)
        .map(|group| Active::start(shared, group, req.header("x-mock-tag").unwrap_or(""), out));
    let last = || {
        if let Some(a) = &active {
            a.end(shared);
        }
    };
    let keep = answer(req, out, &mut extra, &mut served, &last);
    last();
    if llm {
        lock(shared).ledger.push(served);
    }
    keep
}

/// A request counted in its `x-mock-concurrency` groups until [`Active::end`] or until its peer goes.
struct Active {
    /// Each group with the index of this request's span in it.
    spans: Arc<Vec<(String, usize)>>,
    ended: Arc<std::sync::atomic::AtomicBool>,
}

impl Active {
    /// Counts the request in each of `groups` (comma-separated) and starts the thread that ends it when
    /// the peer closes `conn`.
    fn start(shared: &Shared, groups: &str, tag: &str, conn: &TcpStream) -> Active {
        let mut spans = Vec::new();
        {
            let mut rec = lock(shared);
            let now = micros();
            for group in groups.split(',').map(str::trim).filter(|g| !g.is_empty()) {
                let g = rec.concurrency.entry(group.to_string()).or_default();
                g.active += 1;
                g.total += 1;
                g.max = g.max.max(g.active);
                g.spans.push(Span {
                    from: now,
                    to: None,
                    how: "",
                    tag: tag.to_string(),
                });
                spans.push((group.to_string(), g.spans.len() - 1));
            }
        }
        let a = Active {
            spans: Arc::new(spans),
            ended: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        if let Ok(watch) = conn.try_clone() {
            let (shared, spans, ended) = (shared.clone(), a.spans.clone(), a.ended.clone());
            thread::spawn(move || {
                // `peek` never takes bytes from the connection: it returns when the peer sends the next
                // request (this one is over; nothing to do) or closes or resets the connection.
                let mut byte = [0u8; 1];
                if matches!(watch.peek(&mut byte), Ok(0) | Err(_)) {
                    Active::finish(&shared, &spans, &ended, "gone");
                }
            });
        }
        a
    }

    /// The answer's last bytes are about to be written (or the connection closed): no longer at the
    /// provider. Recorded before they are sent, so that nothing Envoy does once it has them can come
    /// before it.
    fn end(&self, shared: &Shared) {
        Active::finish(shared, &self.spans, &self.ended, "answered");
    }

    fn finish(
        shared: &Shared,
        spans: &[(String, usize)],
        ended: &std::sync::atomic::AtomicBool,
        how: &'static str,
    ) {
        if ended.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut rec = lock(shared);
        let now = micros();
        for (group, i) in spans {
            // A group cleared (`/_mock/concurrency/reset`) since is left alone.
            if let Some(g) = rec.concurrency.get_mut(group) {
                if let Some(span) = g.spans.get_mut(*i).filter(|s| s.to.is_none()) {
                    span.to = Some(now);
                    span.how = how;
                    g.active = g.active.saturating_sub(1);
                }
            }
        }
    }
}

/// Writes the answer to a recorded request (failure injection, then the LLM answer) and fills in
/// `served` with what was sent; `last` is called just before its last bytes are written (or the
/// connection is closed). Returns false when the connection must be closed.
fn answer(
    req: &Request,
    out: &mut TcpStream,
    extra: &mut Vec<(String, String)>,
    served: &mut Served,
    last: &dyn Fn(),
) -> bool {
    let bare_path = req.path.split('?').next().unwrap_or("");
    let anthropic = bare_path.ends_with("/messages");
    if let Some(ms) = req.header_num("x-mock-delay-ms") {
        thread::sleep(Duration::from_millis(ms.min(600_000)));
    }
    if req.header("x-mock-reset").is_some_and(|v| v.trim() == "1") {
        served.outcome = "reset";
        last();
        let _ = out.shutdown(Shutdown::Both);
        return false;
    }
    if let Some(status) = req.header_num("x-mock-status") {
        let status = status.clamp(100, 599) as u16;
        if status >= 400 {
            served.outcome = "error";
            served.status = status;
            if status == 429 {
                if let Some(ra) = req.header("x-mock-retry-after") {
                    extra.push(("retry-after".into(), ra.to_string()));
                }
            }
            let (etype, code) = match status {
                429 => ("rate_limit_error", "rate_limit_exceeded"),
                400..=499 => ("invalid_request_error", "mock_error"),
                _ => ("server_error", "mock_upstream_error"),
            };
            let message = format!("mock-provider injected status {status}");
            let family = Endpoint::of(bare_path).map(Endpoint::family);
            let body = if family == Some(Family::Gemini) {
                let gstatus = match status {
                    429 => "RESOURCE_EXHAUSTED",
                    400 => "INVALID_ARGUMENT",
                    401 => "UNAUTHENTICATED",
                    403 => "PERMISSION_DENIED",
                    404 => "NOT_FOUND",
                    503 => "UNAVAILABLE",
                    _ => "INTERNAL",
                };
                json!({"error": {"code": status, "message": message, "status": gstatus}})
            } else if family == Some(Family::Bedrock) {
                let exc = match status {
                    429 => "ThrottlingException",
                    400..=499 => "ValidationException",
                    503 => "ServiceUnavailableException",
                    _ => "InternalServerException",
                };
                extra.push(("x-amzn-errortype".into(), exc.into()));
                json!({"message": message})
            } else if anthropic {
                let atype = match status {
                    429 => "rate_limit_error",
                    529 => "overloaded_error",
                    400..=499 => "invalid_request_error",
                    _ => "api_error",
                };
                json!({"type": "error", "error": {"type": atype, "message": message}})
            } else {
                json!({"error": {"message": message, "type": etype, "param": null, "code": code}})
            };
            last();
            return write_response(
                out,
                status,
                "application/json",
                extra,
                body.to_string().as_bytes(),
            );
        }
    }

    let kind = Endpoint::of(bare_path);
    if req.method != "POST" || kind.is_none() {
        let body = if bare_path == "/healthz" {
            json!({"ok": true})
        } else {
            json!({"ok": true, "path": bare_path})
        };
        return write_response(
            out,
            200,
            "application/json",
            extra,
            body.to_string().as_bytes(),
        );
    }
    let Some(kind) = kind else { return false };
    let parsed = serde_json::from_slice::<Value>(&req.body)
        .ok()
        .filter(Value::is_object);
    // A body that is not a JSON object; and, as the real APIs: Anthropic's Messages refuse fields they
    // do not define, OpenAI's Responses an `include_usage` they do not have (their streams end with
    // their usage anyway).
    let refusal = match (&parsed, kind) {
        (None, _) => Some(
            json!({"error": {"message": "mock-provider: request body is not a JSON object",
                "type": "invalid_request_error", "param": null, "code": "invalid_json"}}),
        ),
        (Some(p), Endpoint::Messages) if p.get("stream_options").is_some() => Some(
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "stream_options: Extra inputs are not permitted"}}),
        ),
        (Some(p), Endpoint::Responses) if p.pointer("/stream_options/include_usage").is_some() => {
            Some(
                json!({"error": {"message": "Unknown parameter: 'stream_options.include_usage'.",
                    "type": "invalid_request_error", "param": null, "code": "unknown_parameter"}}),
            )
        }
        _ => None,
    };
    let (Some(parsed), None) = (parsed, &refusal) else {
        served.outcome = "error";
        served.status = 400;
        last();
        let body = match kind.family() {
            Family::Gemini => json!({"error": {"code": 400, "status": "INVALID_ARGUMENT",
                "message": "mock-provider: request body is not a JSON object"}}),
            Family::Bedrock => {
                extra.push(("x-amzn-errortype".into(), "ValidationException".into()));
                json!({"message": "mock-provider: request body is not a JSON object"})
            }
            _ => refusal.unwrap_or_default(),
        };
        return write_response(
            out,
            400,
            "application/json",
            extra,
            body.to_string().as_bytes(),
        );
    };
    if matches!(kind.family(), Family::Gemini | Family::Bedrock) {
        let usage = Usage::of(&parsed, kind, req);
        served.prompt = usage.prompt;
        served.completion = usage.completion;
        served.status = 200;
        return answer_family(req, out, extra, served, last, kind, &parsed, &usage);
    }
    let usage = Usage::of(&parsed, kind, req);
    served.prompt = usage.prompt;
    served.completion = usage.completion;
    served.status = 200;
    provider_ratelimit_headers(req, anthropic, extra);
    let model = parsed
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock-model")
        .to_string();
    let stream = parsed.get("stream").and_then(Value::as_bool) == Some(true);
    let cut_after = req.header_num("x-mock-cut-after").map(|n| n as usize);
    if stream && kind != Endpoint::Embeddings {
        served.stream = true;
        let include_usage = parsed
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let delay = Duration::from_millis(req.header_num("x-mock-chunk-delay-ms").unwrap_or(5));
        let (mut events, at) = stream_events(kind, &model, &usage, include_usage);
        if no_output_count(req) {
            events = events
                .iter()
                .map(|e| without_output_count_event(e))
                .collect();
        }
        let end = if wants_gzip(req) {
            extra.push(("content-encoding".into(), "gzip".into()));
            write_stream(
                out,
                extra,
                &gzip_events(&events),
                "text/event-stream",
                delay,
                cut_after,
                last,
            )
        } else {
            write_stream(
                out,
                extra,
                &events,
                "text/event-stream",
                delay,
                cut_after,
                last,
            )
        };
        // The generated text of the events written whole: what the provider streamed.
        for (piece, i) in pieces(usage.completion).iter().zip(at) {
            if i < end.sent {
                served.output_sent += piece.split_whitespace().count() as u64;
                served.content_bytes += piece.len() as u64;
            }
        }
        if end.complete {
            served.outcome = "complete";
        } else {
            served.outcome = "cut";
            let asked = cut_after.map(|n| n.min(events.len()));
            served.cut_by = if asked == Some(end.sent) {
                "injected"
            } else {
                "peer"
            };
        }
        return end.complete;
    }
    // A JSON answer: the provider generated the whole completion, however much of it is delivered.
    served.output_sent = usage.completion;
    let mut body = full_body(kind, &model, &usage);
    if no_output_count(req) {
        without_output_count(&mut body);
    }
    if kind == Endpoint::Responses
        && parsed.get("background").and_then(Value::as_bool) == Some(true)
    {
        // As OpenAI answers a background response: queued, no output and no usage yet (the
        // generation, which the ledger counts, happens after the answer).
        body["status"] = json!("queued");
        body["output"] = json!([]);
        body["usage"] = Value::Null;
    }
    let body = body.to_string();
    if wants_gzip(req) && cut_after.is_none() {
        extra.push(("content-encoding".into(), "gzip".into()));
        let gz = gzip_events(&[body]).concat();
        last();
        let ok = write_response(out, 200, "application/json", extra, &gz);
        served.finish_json(ok, gz.len());
        return ok;
    }
    if cut_after.is_some() {
        let head = response_head(200, "application/json", extra, Some(body.len()));
        let half = body.len() / 2;
        let _ = out.write_all(head.as_bytes());
        let _ = out.write_all(body.as_bytes().get(..half).unwrap_or_default());
        let _ = out.flush();
        last();
        let _ = out.shutdown(Shutdown::Both);
        served.outcome = "cut";
        served.cut_by = "injected";
        served.body_bytes = half as u64;
        return false;
    }
    last();
    let ok = write_response(out, 200, "application/json", extra, body.as_bytes());
    served.finish_json(ok, body.len());
    ok
}

/// One LLM answer in the served-usage ledger (`GET /_mock/ledger`).
#[derive(Default)]
struct Served {
    /// `x-mock-tenant`, else `x-tenant-id`, else `-`.
    tenant: String,
    /// `x-mock-tag` (empty when absent): lets a test join its own record of the request.
    tag: String,
    path: String,
    stream: bool,
    /// `complete`, `cut` (the answer ended early), `reset` (closed without an answer) or `error`
    /// (an error status: injected, or a body that is not JSON).
    outcome: &'static str,
    /// For `cut`: `injected` (`x-mock-cut-after`) or `peer` (a write failed: Envoy or the client left).
    cut_by: &'static str,
    /// Status sent (0: none).
    status: u16,
    /// Prompt tokens of the request (the mock's rule).
    prompt: u64,
    /// Completion tokens generated for the whole answer.
    completion: u64,
    /// Completion tokens sent: streams, those of the content events written whole; JSON, all.
    output_sent: u64,
    /// Bytes of generated text in the stream events written whole.
    content_bytes: u64,
    /// Body bytes written (JSON answers).
    body_bytes: u64,
}

impl Served {
    fn of(req: &Request, path: &str) -> Served {
        let tenant = req
            .header("x-mock-tenant")
            .or_else(|| req.header("x-tenant-id"))
            .unwrap_or("-");
        Served {
            tenant: tenant.to_string(),
            tag: req.header("x-mock-tag").unwrap_or("").to_string(),
            path: path.to_string(),
            ..Served::default()
        }
    }

    /// A JSON answer written whole (`ok`) or not (the peer left while it was written).
    fn finish_json(&mut self, ok: bool, len: usize) {
        self.body_bytes = len as u64;
        if ok {
            self.outcome = "complete";
        } else {
            self.outcome = "cut";
            self.cut_by = "peer";
        }
    }

    /// Tokens served: prompt + completion tokens sent for an answer that started, 0 for a reset or
    /// an error status.
    fn tokens(&self) -> u64 {
        match self.outcome {
            "complete" | "cut" => self.prompt + self.output_sent,
            _ => 0,
        }
    }

    fn to_json(&self) -> Value {
        json!({"tenant": self.tenant, "tag": self.tag, "path": self.path, "stream": self.stream,
               "outcome": self.outcome, "cut_by": self.cut_by, "status": self.status,
               "prompt": self.prompt, "completion": self.completion,
               "output_sent": self.output_sent, "content_bytes": self.content_bytes,
               "body_bytes": self.body_bytes, "tokens": self.tokens()})
    }
}

/// `{"served": n, "tokens": t, "tenants": {<tenant>: {requests, complete, cut, reset, error, tokens,
/// prompt_tokens, output_tokens}}, "requests": [<one object per answer>]}`.
fn ledger_json(ledger: &[Served]) -> Value {
    let mut tenants = Map::new();
    for s in ledger {
        let t = tenants.entry(s.tenant.clone()).or_insert_with(|| {
            json!({"requests": 0, "complete": 0, "cut": 0, "reset": 0, "error": 0, "tokens": 0,
                   "prompt_tokens": 0, "output_tokens": 0})
        });
        let mut add = |k: &str, n: u64| {
            if let Some(v) = t.get_mut(k) {
                *v = json!(v.as_u64().unwrap_or(0) + n);
            }
        };
        add("requests", 1);
        add(s.outcome, 1);
        add("tokens", s.tokens());
        if s.tokens() > 0 {
            add("prompt_tokens", s.prompt);
            add("output_tokens", s.output_sent);
        }
    }
    json!({
        "served": ledger.len(),
        "tokens": ledger.iter().map(Served::tokens).sum::<u64>(),
        "tenants": tenants,
        "requests": ledger.iter().map(Served::to_json).collect::<Vec<_>>(),
    })
}

/// The provider's own rate-limit trios asked for by `x-mock-ratelimit-{tokens,requests}: L,R`.
fn provider_ratelimit_headers(req: &Request, anthropic: bool, extra: &mut Vec<(String, String)>) {
    for res in ["tokens", "requests"] {
        let Some((limit, remaining)) = req
            .header(&format!("x-mock-ratelimit-{res}"))
            .and_then(|v| v.split_once(','))
        else {
            continue;
        };
        let (limit, remaining) = (limit.trim().to_string(), remaining.trim().to_string());
        if anthropic {
            let reset = rfc3339(now_secs() + 6);
            extra.push((format!("anthropic-ratelimit-{res}-limit"), limit));
            extra.push((format!("anthropic-ratelimit-{res}-remaining"), remaining));
            extra.push((format!("anthropic-ratelimit-{res}-reset"), reset));
        } else {
            extra.push((format!("x-ratelimit-limit-{res}"), limit));
            extra.push((format!("x-ratelimit-remaining-{res}"), remaining));
            extra.push((format!("x-ratelimit-reset-{res}"), "6s".to_string()));
        }
    }
}

/// Unix seconds as an RFC 3339 UTC time (H. Hinnant's civil-from-days).
fn rfc3339(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    Responses,
    Messages,
    /// Gemini API / Vertex AI `…/models/{m}:generateContent` or `:streamGenerateContent`.
    Gemini {
        stream: bool,
    },
    /// Bedrock `/model/{id}/converse` or `/converse-stream`.
    Converse {
        stream: bool,
    },
    /// Bedrock `/model/{id}/invoke` or `/invoke-with-response-stream`.
    Invoke {
        stream: bool,
    },
}

/// The API family an endpoint answers in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Family {
    OpenAi,
    Anthropic,
    Gemini,
    Bedrock,
}

impl Endpoint {
    fn family(self) -> Family {
        match self {
            Endpoint::Messages => Family::Anthropic,
            Endpoint::Gemini { .. } => Family::Gemini,
            Endpoint::Converse { .. } | Endpoint::Invoke { .. } => Family::Bedrock,
            _ => Family::OpenAi,
        }
    }

    fn of(path: &str) -> Option<Endpoint> {
        let last = path.rsplit('/').next().unwrap_or("");
        if let Some((_, verb)) = last.rsplit_once(':') {
            return match verb.to_ascii_lowercase().as_str() {
                "generatecontent" => Some(Endpoint::Gemini { stream: false }),
                "streamgeneratecontent" => Some(Endpoint::Gemini { stream: true }),
                // Claude on Vertex AI: an Anthropic Messages body.
                "rawpredict" | "streamrawpredict" => Some(Endpoint::Messages),
                _ => None,
            };
        }
        if path.contains("/model/") {
            match last {
                "converse" => return Some(Endpoint::Converse { stream: false }),
                "converse-stream" => return Some(Endpoint::Converse { stream: true }),
                "invoke" => return Some(Endpoint::Invoke { stream: false }),
                "invoke-with-response-stream" => return Some(Endpoint::Invoke { stream: true }),
                _ => {}
            }
        }
        if path.ends_with("/chat/completions") {
            Some(Endpoint::Chat)
        } else if path.ends_with("/completions") {
            Some(Endpoint::Completions)
        } else if path.ends_with("/embeddings") {
            Some(Endpoint::Embeddings)
        } else if path.ends_with("/responses") {
            Some(Endpoint::Responses)
        } else if path.ends_with("/messages") {
            Some(Endpoint::Messages)
        } else {
            None
        }
    }
}

struct Usage {
    prompt: u64,
    completion: u64,
    /// True when `completion` hit the request's explicit limit.
    hit_limit: bool,
}

impl Usage {
    fn of(body: &Value, kind: Endpoint, req: &Request) -> Usage {
        let mut bytes = 0usize;
        for field in [
            "messages",
            "prompt",
            "input",
            "system",
            "instructions",
            "contents",
            "systemInstruction",
            "system_instruction",
            "inputText",
        ] {
            if let Some(v) = body.get(field) {
                bytes += text_bytes(v);
            }
        }
        let prompt = ((bytes / 4) as u64).max(1);
        if kind == Endpoint::Embeddings {
            return Usage {
                prompt,
                completion: 0,
                hit_limit: false,
            };
        }
        let explicit = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_u64))
            .or_else(|| {
                [
                    "/generationConfig/maxOutputTokens",
                    "/generation_config/max_output_tokens",
                    "/inferenceConfig/maxTokens",
                    "/inferenceConfig/max_new_tokens",
                    "/max_gen_len",
                    "/textGenerationConfig/maxTokenCount",
                ]
                .iter()
                .find_map(|p| body.pointer(p).and_then(Value::as_u64))
            });
        let over = req.header_num("x-mock-completion-tokens");
        let completion = match (explicit, over) {
            (Some(m), Some(o)) => m.min(o),
            (None, Some(o)) => o,
            (Some(m), None) => m,
            (None, None) => 16,
        };
        Usage {
            prompt,
            completion,
            hit_limit: explicit == Some(completion),
        }
    }
}

/// Bytes of all string leaves, not counting the values of `role` and `type` keys.
fn text_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(text_bytes).sum(),
        Value::Object(o) => o
            .iter()
            .filter(|(k, _)| k.as_str() != "role" && k.as_str() != "type")
            .map(|(_, v)| text_bytes(v))
            .sum(),
        _ => 0,
    }
}

/// The generated completion split into at most 4 pieces (one per stream event).
fn pieces(completion: u64) -> Vec<String> {
    let n = completion.clamp(1, 4);
    let per = completion / n;
    (0..n)
        .map(|i| {
            let count = if i + 1 == n {
                completion - per * (n - 1)
            } else {
                per
            };
            (0..count).map(|j| format!("t{} ", i * per + j)).collect()
        })
        .collect()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn full_body(kind: Endpoint, model: &str, u: &Usage) -> Value {
    let text: String = pieces(u.completion).concat();
    let finish = if u.hit_limit { "length" } else { "stop" };
    let created = now_secs();
    match kind {
        Endpoint::Chat => json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": null, "finish_reason": finish}],
            "usage": {"prompt_tokens": u.prompt, "completion_tokens": u.completion,
                      "total_tokens": u.prompt + u.completion}
        }),
        Endpoint::Completions => json!({
            "id": "cmpl-mock", "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish}],
            "usage": {"prompt_tokens": u.prompt, "completion_tokens": u.completion,
                      "total_tokens": u.prompt + u.completion}
        }),
        Endpoint::Embeddings => json!({
            "object": "list", "model": model,
            "data": [{"object": "embedding", "index": 0,
                      "embedding": [0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875]}],
            "usage": {"prompt_tokens": u.prompt, "total_tokens": u.prompt}
        }),
        Endpoint::Responses
        | Endpoint::Gemini { .. }
        | Endpoint::Converse { .. }
        | Endpoint::Invoke { .. } => responses_object(model, &text, u, created),
        Endpoint::Messages => json!({
            "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": if u.hit_limit { "max_tokens" } else { "end_turn" },
            "stop_sequence": null,
            "usage": {"input_tokens": u.prompt, "output_tokens": u.completion}
        }),
    }
}

fn responses_object(model: &str, text: &str, u: &Usage, created: u64) -> Value {
    json!({
        "id": "resp_mock", "object": "response", "created_at": created, "status": "completed",
        "model": model,
        "output": [{"type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": u.prompt, "output_tokens": u.completion,
                  "total_tokens": u.prompt + u.completion}
    })
}

/// SSE events, each already framed (`data: …\n\n` or `event: …\ndata: …\n\n`).
/// `x-mock-no-output-count: 1`: the final usage without its output count (a provider that reports
/// the prompt only; Anthropic's `message_delta` then has `"usage":{}`).
fn no_output_count(req: &Request) -> bool {
    req.header("x-mock-no-output-count")
        .is_some_and(|v| v.trim() == "1")
}

/// `completion_tokens` / `output_tokens` taken out of `usage` and `response.usage`.
fn without_output_count(v: &mut Value) {
    for ptr in ["/usage", "/response/usage"] {
        if let Some(Value::Object(u)) = v.pointer_mut(ptr) {
            u.remove("completion_tokens");
            u.remove("output_tokens");
        }
    }
}

/// [`without_output_count`] of one SSE event (`message_start`'s usage kept: it is not the final one).
fn without_output_count_event(ev: &str) -> String {
    let mut out = String::new();
    for line in ev.split_inclusive('\n') {
        match line
            .strip_prefix("data: ")
            .map(|d| serde_json::from_str::<Value>(d.trim_end()))
        {
            Some(Ok(mut v)) if v.get("type").and_then(Value::as_str) != Some("message_start") => {
                without_output_count(&mut v);
                out.push_str(&format!("data: {v}\n"));
            }
            _ => out.push_str(line),
        }
    }
    out
}

fn stream_events(
    kind: Endpoint,
    model: &str,
    u: &Usage,
    include_usage: bool,
) -> (Vec<String>, Vec<usize>) {
    let data = |v: Value| format!("data: {v}\n\n");
    let named = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n");
    let created = now_secs();
    let finish = if u.hit_limit { "length" } else { "stop" };
    let parts = pieces(u.completion);
    let mut ev = Vec::new();
    // Index in `ev` of the event carrying each piece of generated text.
    let mut at = Vec::new();
    match kind {
        Endpoint::Chat => {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": created,
                       "model": model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": null,
                                    "finish_reason": finish}]})
            };
            ev.push(data(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            )));
            for p in &parts {
                ev.push(data(chunk(json!({"content": p}), Value::Null)));
                at.push(ev.len() - 1);
            }
            ev.push(data(chunk(json!({}), json!(finish))));
            if include_usage {
                ev.push(data(
                    json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk",
                    "created": created, "model": model, "choices": [],
                    "usage": {"prompt_tokens": u.prompt, "completion_tokens": u.completion,
                              "total_tokens": u.prompt + u.completion}}),
                ));
            }
            ev.push("data: [DONE]\n\n".to_string());
        }
        Endpoint::Completions => {
            for (i, p) in parts.iter().enumerate() {
                let fin = if i + 1 == parts.len() {
                    json!(finish)
                } else {
                    Value::Null
                };
                ev.push(data(json!({"id": "cmpl-mock", "object": "text_completion",
                    "created": created, "model": model,
                    "choices": [{"text": p, "index": 0, "logprobs": null, "finish_reason": fin}]})));
                at.push(ev.len() - 1);
            }
            if include_usage {
                ev.push(data(json!({"id": "cmpl-mock", "object": "text_completion",
                    "created": created, "model": model, "choices": [],
                    "usage": {"prompt_tokens": u.prompt, "completion_tokens": u.completion,
                              "total_tokens": u.prompt + u.completion}})));
            }
            ev.push("data: [DONE]\n\n".to_string());
        }
        Endpoint::Responses => {
            let mut seq = 0u64;
            let mut next = || {
                seq += 1;
                seq
            };
            let mut in_progress = responses_object(model, "", u, created);
            in_progress["status"] = json!("in_progress");
            in_progress["output"] = json!([]);
            in_progress["usage"] = Value::Null;
            ev.push(named(
                "response.created",
                json!({"type": "response.created", "sequence_number": next(),
                       "response": in_progress.clone()}),
            ));
            ev.push(named(
                "response.in_progress",
                json!({"type": "response.in_progress", "sequence_number": next(),
                       "response": in_progress}),
            ));
            ev.push(named(
                "response.output_item.added",
                json!({"type": "response.output_item.added", "sequence_number": next(),
                       "output_index": 0,
                       "item": {"type": "message", "id": "msg_mock", "status": "in_progress",
                                "role": "assistant", "content": []}}),
            ));
            ev.push(named(
                "response.content_part.added",
                json!({"type": "response.content_part.added", "sequence_number": next(),
                       "item_id": "msg_mock", "output_index": 0, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            ));
            for p in &parts {
                ev.push(named(
                    "response.output_text.delta",
                    json!({"type": "response.output_text.delta", "sequence_number": next(),
                           "item_id": "msg_mock", "output_index": 0, "content_index": 0,
                           "delta": p}),
                ));
                at.push(ev.len() - 1);
            }
            let text: String = parts.concat();
            ev.push(named(
                "response.output_text.done",
                json!({"type": "response.output_text.done", "sequence_number": next(),
                       "item_id": "msg_mock", "output_index": 0, "content_index": 0,
                       "text": text}),
            ));
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            ev.push(named(
                "response.content_part.done",
                json!({"type": "response.content_part.done", "sequence_number": next(),
                       "item_id": "msg_mock", "output_index": 0, "content_index": 0,
                       "part": part.clone()}),
            ));
            ev.push(named(
                "response.output_item.done",
                json!({"type": "response.output_item.done", "sequence_number": next(),
                       "output_index": 0,
                       "item": {"type": "message", "id": "msg_mock", "status": "completed",
                                "role": "assistant", "content": [part]}}),
            ));
            ev.push(named(
                "response.completed",
                json!({"type": "response.completed", "sequence_number": next(),
                       "response": responses_object(model, &text, u, created)}),
            ));
        }
        Endpoint::Messages => {
            ev.push(named(
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": u.prompt, "output_tokens": 1}}}),
            ));
            ev.push(named(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            ));
            for p in &parts {
                ev.push(named(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": p}}),
                ));
                at.push(ev.len() - 1);
            }
            ev.push(named(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ));
            ev.push(named(
                "message_delta",
                json!({"type": "message_delta",
                       "delta": {"stop_reason": if u.hit_limit { "max_tokens" } else { "end_turn" },
                                 "stop_sequence": null},
                       "usage": {"output_tokens": u.completion}}),
            ));
            ev.push(named("message_stop", json!({"type": "message_stop"})));
        }
        Endpoint::Embeddings
        | Endpoint::Gemini { .. }
        | Endpoint::Converse { .. }
        | Endpoint::Invoke { .. } => {}
    }
    (ev, at)
}

fn response_head(
    status: u16,
    ctype: &str,
    extra: &[(String, String)],
    len: Option<usize>,
) -> String {
    let mut h = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {ctype}\r\n",
        reason(status)
    );
    match len {
        Some(n) => h.push_str(&format!("content-length: {n}\r\n")),
        None => h.push_str("transfer-encoding: chunked\r\n"),
    }
    for (k, v) in extra {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h
}

fn write_response(
    out: &mut TcpStream,
    status: u16,
    ctype: &str,
    extra: &[(String, String)],
    body: &[u8],
) -> bool {
    let mut buf = response_head(status, ctype, extra, Some(body.len())).into_bytes();
    buf.extend_from_slice(body);
    out.write_all(&buf).and_then(|_| out.flush()).is_ok()
}

/// Whether the answer is gzip-encoded: the client accepts gzip, or `x-mock-gzip: 1`.
fn wants_gzip(req: &Request) -> bool {
    req.header("x-mock-gzip").is_some_and(|v| v.trim() == "1")
        || req
            .header("accept-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("gzip"))
}

/// One gzip stream over `parts`, split so that part i's bytes (a stored deflate block) can be sent
/// as chunk i: the gzip header goes with the first, the final block and trailer with the last.
fn gzip_events<E: AsRef<[u8]>>(parts: &[E]) -> Vec<Vec<u8>> {
    let mut crc = 0xFFFF_FFFFu32;
    let mut total = 0u32;
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let mut b = Vec::new();
        if i == 0 {
            b.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
        }
        for block in p.as_ref().chunks(65_535) {
            let len = block.len() as u16;
            b.push(0);
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&(!len).to_le_bytes());
            b.extend_from_slice(block);
            for &byte in block {
                crc ^= u32::from(byte);
                for _ in 0..8 {
                    crc = if crc & 1 == 1 {
                        (crc >> 1) ^ 0xEDB8_8320
                    } else {
                        crc >> 1
                    };
                }
            }
            total = total.wrapping_add(u32::from(len));
        }
        if i + 1 == parts.len() {
            b.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
            b.extend_from_slice(&(!crc).to_le_bytes());
            b.extend_from_slice(&total.to_le_bytes());
        }
        out.push(b);
    }
    out
}

/// How a stream ended: the events written whole, and whether the stream ended properly (the
/// terminating chunk was written).
struct StreamEnd {
    sent: usize,
    complete: bool,
}

fn write_stream<E: AsRef<[u8]>>(
    out: &mut TcpStream,
    extra: &[(String, String)],
    events: &[E],
    ctype: &str,
    delay: Duration,
    cut_after: Option<usize>,
    last: &dyn Fn(),
) -> StreamEnd {
    let mut extra = extra.to_vec();
    extra.push(("cache-control".into(), "no-cache".into()));
    let head = response_head(200, ctype, &extra, None);
    let mut end = StreamEnd {
        sent: 0,
        complete: false,
    };
    if out.write_all(head.as_bytes()).is_err() {
        return end;
    }
    for (i, e) in events.iter().enumerate() {
        if cut_after.is_some_and(|n| i >= n) {
            let _ = out.flush();
            last();
            let _ = out.shutdown(Shutdown::Both);
            return end;
        }
        if i > 0 && !delay.is_zero() {
            thread::sleep(delay);
        }
        let e = e.as_ref();
        let mut chunk = format!("{:x}\r\n", e.len()).into_bytes();
        chunk.extend_from_slice(e);
        chunk.extend_from_slice(b"\r\n");
        if out.write_all(&chunk).and_then(|_| out.flush()).is_err() {
            return end;
        }
        end.sent = i + 1;
    }
    last();
    if cut_after.is_some() {
        // Asked to cut after more events than exist: still never send the terminating chunk.
        let _ = out.shutdown(Shutdown::Both);
        return end;
    }
    end.complete = out
        .write_all(b"0\r\n\r\n")
        .and_then(|_| out.flush())
        .is_ok();
    end
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// The model a Gemini or Bedrock path names (percent-decoded), for the answer's `modelVersion`.
fn path_model(path: &str) -> String {
    let bare = path.split('?').next().unwrap_or(path);
    let raw = if let Some(i) = bare.find("/model/") {
        let rest = &bare[i + "/model/".len()..];
        rest.rsplit_once('/').map_or(rest, |(m, _)| m)
    } else {
        let last = bare.rsplit('/').next().unwrap_or("");
        last.rsplit_once(':').map_or(last, |(m, _)| m)
    };
    let mut out = Vec::new();
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(Ok(v)) = raw.get(i + 1..i + 3).map(|h| u8::from_str_radix(h, 16)) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Standard base64 with padding.
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// CRC-32/IEEE, bit by bit (the event stream's checksums).
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// One AWS event-stream message with string headers: prelude (lengths + CRC), headers, payload,
/// message CRC.
fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (k, v) in headers {
        h.push(k.len() as u8);
        h.extend_from_slice(k.as_bytes());
        h.push(7);
        h.extend_from_slice(&(v.len() as u16).to_be_bytes());
        h.extend_from_slice(v.as_bytes());
    }
    let total = (16 + h.len() + payload.len()) as u32;
    let mut m = total.to_be_bytes().to_vec();
    m.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let c = crc32(&m);
    m.extend_from_slice(&c.to_be_bytes());
    m.extend_from_slice(&h);
    m.extend_from_slice(payload);
    let c = crc32(&m);
    m.extend_from_slice(&c.to_be_bytes());
    m
}

/// A Bedrock stream event.
fn event(ty: &str, payload: &Value) -> Vec<u8> {
    frame(
        &[
            (":event-type", ty),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().as_bytes(),
    )
}

/// Gemini's and Bedrock's answers, JSON and streams: Gemini's SSE (`alt=sse`) or streamed JSON array,
/// Bedrock's AWS event stream (Converse events, or invoke `chunk`s carrying the model's own events in
/// base64, the last with `amazon-bedrock-invocationMetrics`). Usage as each family reports it.
#[allow(clippy::too_many_arguments)]
fn answer_family(
    req: &Request,
    out: &mut TcpStream,
    extra: &mut Vec<(String, String)>,
    served: &mut Served,
    last: &dyn Fn(),
    kind: Endpoint,
    parsed: &Value,
    u: &Usage,
) -> bool {
    let model = path_model(&req.path);
    let parts = pieces(u.completion);
    let text: String = parts.concat();
    let cut_after = req.header_num("x-mock-cut-after").map(|n| n as usize);
    let anthropic_body = parsed.get("anthropic_version").is_some();
    let gemini_usage = |candidates: u64| {
        json!({"promptTokenCount": u.prompt, "candidatesTokenCount": candidates,
               "totalTokenCount": u.prompt + candidates})
    };
    let stream = match kind {
        Endpoint::Gemini { stream }
        | Endpoint::Converse { stream }
        | Endpoint::Invoke { stream } => stream,
        _ => false,
    };
    if !stream {
        served.output_sent = u.completion;
        let body = match kind {
            Endpoint::Gemini { .. } => json!({
                "candidates": [{"content": {"parts": [{"text": text}], "role": "model"},
                                "finishReason": if u.hit_limit { "MAX_TOKENS" } else { "STOP" },
                                "index": 0}],
                "usageMetadata": gemini_usage(u.completion),
                "modelVersion": model,
                "responseId": "mock-resp"}),
            Endpoint::Converse { .. } => json!({
                "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                "stopReason": if u.hit_limit { "max_tokens" } else { "end_turn" },
                "usage": {"inputTokens": u.prompt, "outputTokens": u.completion,
                          "totalTokens": u.prompt + u.completion},
                "metrics": {"latencyMs": 5}}),
            _ => {
                extra.push((
                    "x-amzn-bedrock-input-token-count".into(),
                    u.prompt.to_string(),
                ));
                extra.push((
                    "x-amzn-bedrock-output-token-count".into(),
                    u.completion.to_string(),
                ));
                if anthropic_body {
                    full_body(Endpoint::Messages, &model, u)
                } else {
                    json!({"generation": text, "prompt_token_count": u.prompt,
                           "generation_token_count": u.completion,
                           "stop_reason": if u.hit_limit { "length" } else { "stop" }})
                }
            }
        };
        let body = body.to_string();
        last();
        let ok = write_response(out, 200, "application/json", extra, body.as_bytes());
        served.finish_json(ok, body.len());
        return ok;
    }
    served.stream = true;
    let mut ev: Vec<Vec<u8>> = Vec::new();
    let mut at = Vec::new();
    let ctype;
    match kind {
        Endpoint::Gemini { .. } => {
            let sse = req.path.contains("alt=sse");
            ctype = if sse {
                "text/event-stream"
            } else {
                "application/json"
            };
            let mut sent = 0u64;
            for (i, p) in parts.iter().enumerate() {
                sent += p.split_whitespace().count() as u64;
                let mut cand = json!({"content": {"parts": [{"text": p}], "role": "model"},
                                      "index": 0});
                if i + 1 == parts.len() {
                    cand["finishReason"] = json!(if u.hit_limit { "MAX_TOKENS" } else { "STOP" });
                }
                let chunk = json!({"candidates": [cand], "usageMetadata": gemini_usage(sent),
                                   "modelVersion": model});
                let e = if sse {
                    format!("data: {chunk}\r\n\r\n")
                } else if i == 0 {
                    format!("[{chunk}")
                } else {
                    format!(",\r\n{chunk}")
                };
                ev.push(e.into_bytes());
                at.push(ev.len() - 1);
            }
            if !sse {
                ev.push(b"]".to_vec());
            }
        }
        Endpoint::Converse { .. } => {
            ctype = "application/vnd.amazon.eventstream";
            ev.push(event("messageStart", &json!({"role": "assistant"})));
            for p in &parts {
                ev.push(event(
                    "contentBlockDelta",
                    &json!({"contentBlockIndex": 0, "delta": {"text": p}}),
                ));
                at.push(ev.len() - 1);
            }
            ev.push(event("contentBlockStop", &json!({"contentBlockIndex": 0})));
            ev.push(event(
                "messageStop",
                &json!({"stopReason": if u.hit_limit { "max_tokens" } else { "end_turn" }}),
            ));
            ev.push(event(
                "metadata",
                &json!({"usage": {"inputTokens": u.prompt, "outputTokens": u.completion,
                                  "totalTokens": u.prompt + u.completion},
                        "metrics": {"latencyMs": 5}}),
            ));
        }
        _ => {
            ctype = "application/vnd.amazon.eventstream";
            let chunk =
                |v: Value| event("chunk", &json!({"bytes": base64(v.to_string().as_bytes())}));
            let metrics = json!({"inputTokenCount": u.prompt, "outputTokenCount": u.completion,
                                 "invocationLatency": 5, "firstByteLatency": 1});
            if anthropic_body {
                ev.push(chunk(json!({"type": "message_start", "message": {
                    "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": u.prompt, "output_tokens": 1}}})));
                ev.push(chunk(json!({"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}})));
                for p in &parts {
                    ev.push(chunk(json!({"type": "content_block_delta", "index": 0,
                                         "delta": {"type": "text_delta", "text": p}})));
                    at.push(ev.len() - 1);
                }
                ev.push(chunk(json!({"type": "content_block_stop", "index": 0})));
                ev.push(chunk(json!({"type": "message_delta",
                    "delta": {"stop_reason": if u.hit_limit { "max_tokens" } else { "end_turn" },
                              "stop_sequence": null},
                    "usage": {"output_tokens": u.completion}})));
                ev.push(chunk(json!({"type": "message_stop",
                                     "amazon-bedrock-invocationMetrics": metrics})));
            } else {
                for p in &parts {
                    ev.push(chunk(json!({"generation": p, "prompt_token_count": null,
                                         "generation_token_count": null, "stop_reason": null})));
                    at.push(ev.len() - 1);
                }
                ev.push(chunk(json!({"generation": "", "stop_reason":
                                         if u.hit_limit { "length" } else { "stop" },
                                     "amazon-bedrock-invocationMetrics": metrics})));
            }
        }
    }
    let delay = Duration::from_millis(req.header_num("x-mock-chunk-delay-ms").unwrap_or(5));
    // Google compresses when asked; Bedrock's event streams are never compressed.
    let end = if ctype != "application/vnd.amazon.eventstream" && wants_gzip(req) {
        extra.push(("content-encoding".into(), "gzip".into()));
        write_stream(out, extra, &gzip_events(&ev), ctype, delay, cut_after, last)
    } else {
        write_stream(out, extra, &ev, ctype, delay, cut_after, last)
    };
    for (piece, i) in parts.iter().zip(at) {
        if i < end.sent {
            served.output_sent += piece.split_whitespace().count() as u64;
            served.content_bytes += piece.len() as u64;
        }
    }
    if end.complete {
        served.outcome = "complete";
    } else {
        served.outcome = "cut";
        let asked = cut_after.map(|n| n.min(ev.len()));
        served.cut_by = if asked == Some(end.sent) {
            "injected"
        } else {
            "peer"
        };
    }
    end.complete
}
