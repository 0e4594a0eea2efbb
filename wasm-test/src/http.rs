//! Minimal HTTP/1.1 client over `std::net::TcpStream` to 127.0.0.1 (one-shot, keep-alive, streaming
//! with abort).

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Timeout of [`post`], [`get`] and [`Client`] requests.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A complete response.
#[derive(Clone, Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers with lowercased names, in arrival order.
    pub headers: Vec<(String, String)>,
    /// Decoded body (chunked framing removed).
    pub body: Vec<u8>,
}

impl Response {
    /// First header with that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// A header parsed as a number (None if absent or not a number).
    pub fn header_f64(&self, name: &str) -> Option<f64> {
        self.header(name).and_then(|v| v.trim().parse().ok())
    }

    /// Names of headers starting with `prefix` (lowercase).
    pub fn headers_with_prefix(&self, prefix: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Body as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Body as JSON; panics with the body text if it is not JSON.
    pub fn json(&self) -> Value {
        json(self)
    }
}

/// Body of `r` as JSON; panics with status and body if it is not JSON.
pub fn json(r: &Response) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| {
        panic!(
            "response body is not JSON ({e}): status {} body {:?}",
            r.status,
            r.text()
        )
    })
}

fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
}

/// POST with [`DEFAULT_TIMEOUT`].
pub fn post(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, String> {
    request(port, "POST", path, headers, body, DEFAULT_TIMEOUT)
}

/// POST a JSON value with `content-type: application/json` added.
pub fn post_json(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Result<Response, String> {
    let mut h = headers.to_vec();
    h.push(("content-type", "application/json"));
    post(port, path, &h, body.to_string().as_bytes())
}

/// GET with [`DEFAULT_TIMEOUT`].
pub fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<Response, String> {
    request(port, "GET", path, headers, b"", DEFAULT_TIMEOUT)
}

/// One request on a fresh connection (`connection: close`). Err on connect failure, timeout or
/// a connection closed before a complete response.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Response, String> {
    let deadline = Instant::now() + timeout;
    let stream = connect(port, timeout)?;
    let mut h = headers.to_vec();
    h.push(("connection", "close"));
    write_request(&stream, port, method, path, &h, body)?;
    let mut reader = BufReader::new(stream);
    read_response(&mut reader, method, deadline).map(|(r, _)| r)
}

fn connect(port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let s = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5)))
        .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    Ok(s)
}

/// Writes the request. A `transfer-encoding: chunked` header in `headers` sends the body in
/// two chunks; otherwise `content-length` is added (unless given) for bodies and POST/PUT.
fn write_request(
    mut stream: &TcpStream,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(), String> {
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let mut buf = format!("{method} {path} HTTP/1.1\r\n");
    if !has("host") {
        buf.push_str(&format!("host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        buf.push_str(&format!("{k}: {v}\r\n"));
    }
    if !chunked
        && !has("content-length")
        && (!body.is_empty() || method == "POST" || method == "PUT")
    {
        buf.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    buf.push_str("\r\n");
    let mut bytes = buf.into_bytes();
    if chunked {
        let mid = body.len() / 2;
        for part in [&body[..mid], &body[mid..]] {
            if !part.is_empty() {
                bytes.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                bytes.extend_from_slice(part);
                bytes.extend_from_slice(b"\r\n");
            }
        }
        bytes.extend_from_slice(b"0\r\n\r\n");
    } else {
        bytes.extend_from_slice(body);
    }
    stream
        .write_all(&bytes)
        .and_then(|_| stream.flush())
        .map_err(|e| format!("write: {e}"))
}

fn io_err(e: std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timeout".to_string(),
        _ => format!("read: {e}"),
    }
}

fn check(deadline: Instant) -> Result<(), String> {
    if Instant::now() > deadline {
        Err("timeout".into())
    } else {
        Ok(())
    }
}

/// Reads one line (without CRLF). Ok(None) on EOF before any byte.
fn line(r: &mut BufReader<TcpStream>, deadline: Instant) -> Result<Option<String>, String> {
    check(deadline)?;
    let mut s = String::new();
    match r.read_line(&mut s) {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(s.trim_end_matches(['\r', '\n']).to_string())),
        Err(e) => Err(io_err(e)),
    }
}

struct Head {
    status: u16,
    headers: Vec<(String, String)>,
}

/// Reads the status line and headers, skipping 1xx interim responses. Err("eof") when the
/// connection closed before any byte.
fn read_head(r: &mut BufReader<TcpStream>, deadline: Instant) -> Result<Head, String> {
    loop {
        let status_line = line(r, deadline)?.ok_or_else(|| "eof".to_string())?;
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {status_line:?}"))?;
        let mut headers = Vec::new();
        loop {
            let l = line(r, deadline)?.ok_or("connection closed in headers")?;
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        return Ok(Head { status, headers });
    }
}

enum BodyKind {
    None,
    Length(usize),
    Chunked,
    UntilClose,
}

fn body_kind(method: &str, head: &Head) -> BodyKind {
    if method == "HEAD" || head.status == 204 || head.status == 304 {
        return BodyKind::None;
    }
    if find_header(&head.headers, "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        return BodyKind::Chunked;
    }
    match find_header(&head.headers, "content-length").and_then(|v| v.parse().ok()) {
        Some(n) => BodyKind::Length(n),
        None => BodyKind::UntilClose,
    }
}

/// Reads the body, calling `sink` with each piece as it arrives; `sink` returns false to stop.
/// Returns (complete, reusable connection).
fn read_body(
    r: &mut BufReader<TcpStream>,
    kind: BodyKind,
    deadline: Instant,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(bool, bool), String> {
    match kind {
        BodyKind::None => Ok((true, true)),
        BodyKind::Length(n) => {
            let mut left = n;
            let mut buf = [0u8; 16384];
            while left > 0 {
                check(deadline)?;
                let want = left.min(buf.len());
                let got = r.read(&mut buf[..want]).map_err(io_err)?;
                if got == 0 {
                    return Err(format!("connection closed with {left} body bytes missing"));
                }
                left -= got;
                if !sink(&buf[..got]) {
                    return Ok((false, false));
                }
            }
            Ok((true, true))
        }
        BodyKind::Chunked => loop {
            let size_line = line(r, deadline)?.ok_or("connection closed in chunked body")?;
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| format!("bad chunk size {size_line:?}"))?;
            if size == 0 {
                while let Some(l) = line(r, deadline)? {
                    if l.is_empty() {
                        break;
                    }
                }
                return Ok((true, true));
            }
            let mut buf = vec![0u8; size];
            check(deadline)?;
            r.read_exact(&mut buf).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => "connection closed in chunk".to_string(),
                _ => io_err(e),
            })?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).map_err(io_err)?;
            if !sink(&buf) {
                return Ok((false, false));
            }
        },
        BodyKind::UntilClose => {
            let mut buf = [0u8; 16384];
            loop {
                check(deadline)?;
                let got = r.read(&mut buf).map_err(io_err)?;
                if got == 0 {
                    return Ok((true, false));
                }
                if !sink(&buf[..got]) {
                    return Ok((false, false));
                }
            }
        }
    }
}

/// Reads a full response; the bool says whether the connection can be reused.
fn read_response(
    r: &mut BufReader<TcpStream>,
    method: &str,
    deadline: Instant,
) -> Result<(Response, bool), String> {
    let head = read_head(r, deadline)?;
    let mut body = Vec::new();
    let kind = body_kind(method, &head);
    let (_, reusable) = read_body(r, kind, deadline, &mut |b| {
        body.extend_from_slice(b);
        true
    })?;
    let close =
        find_header(&head.headers, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    Ok((
        Response {
            status: head.status,
            headers: head.headers,
            body,
        },
        reusable && !close,
    ))
}

/// A keep-alive connection that reconnects when the server closed it.
pub struct Client {
    port: u16,
    timeout: Duration,
    conn: Option<BufReader<TcpStream>>,
    /// Number of TCP connections opened so far.
    pub connections: u32,
}

impl Client {
    /// A client for 127.0.0.1:`port` with [`DEFAULT_TIMEOUT`].
    pub fn new(port: u16) -> Client {
        Client {
            port,
            timeout: DEFAULT_TIMEOUT,
            conn: None,
            connections: 0,
        }
    }

    /// Sets the per-request timeout.
    pub fn with_timeout(mut self, t: Duration) -> Client {
        self.timeout = t;
        self
    }

    /// POST.
    pub fn post(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, String> {
        self.request("POST", path, headers, body)
    }

    /// GET.
    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<Response, String> {
        self.request("GET", path, headers, b"")
    }

    /// One request on the kept connection. A reused connection that turns out closed before
    /// any response byte is replaced once (the request was not processed).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, String> {
        for attempt in 0..2 {
            let reused = self.conn.is_some();
            if self.conn.is_none() {
                self.conn = Some(BufReader::new(connect(self.port, self.timeout)?));
                self.connections += 1;
            }
            let deadline = Instant::now() + self.timeout;
            let Some(reader) = self.conn.as_mut() else {
                return Err("no connection".into());
            };
            let sent = write_request(reader.get_ref(), self.port, method, path, headers, body);
            let result = sent.and_then(|_| read_response(reader, method, deadline));
            match result {
                Ok((resp, reusable)) => {
                    if !reusable {
                        self.conn = None;
                    }
                    return Ok(resp);
                }
                Err(e) => {
                    self.conn = None;
                    let stale = e == "eof" || e.starts_with("write:") || e.contains("reset");
                    if !(reused && stale && attempt == 0) {
                        return Err(e);
                    }
                }
            }
        }
        Err("unreachable".into())
    }
}

/// Options of [`post_stream`].
#[derive(Clone, Debug)]
pub struct StreamOpts {
    /// Close the connection once this many body bytes arrived.
    pub abort_after_bytes: Option<usize>,
    /// Overall timeout.
    pub timeout: Duration,
}

impl Default for StreamOpts {
    fn default() -> Self {
        StreamOpts {
            abort_after_bytes: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// One body piece (a decoded chunk, or one read for non-chunked bodies).
#[derive(Clone, Debug)]
pub struct Piece {
    /// Time since the request was written.
    pub at: Duration,
    /// Bytes.
    pub data: Vec<u8>,
}

/// A response read piece by piece.
#[derive(Clone, Debug)]
pub struct StreamResponse {
    /// Status code.
    pub status: u16,
    /// Headers with lowercased names.
    pub headers: Vec<(String, String)>,
    /// Body pieces in arrival order.
    pub pieces: Vec<Piece>,
    /// The body ended properly (terminating chunk / full length).
    pub complete: bool,
    /// We closed the connection after `abort_after_bytes`.
    pub aborted: bool,
    /// Why the body ended early (connection closed mid-body, timeout), if it did.
    pub error: Option<String>,
}

impl StreamResponse {
    /// First header with that name.
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// All pieces concatenated.
    pub fn body(&self) -> Vec<u8> {
        self.pieces.iter().flat_map(|p| p.data.clone()).collect()
    }

    /// Body as lossy UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body()).into_owned()
    }
}

/// POST and read the body as it arrives. Err only when no response head arrived; a body cut
/// short is reported in `complete`/`error`.
pub fn post_stream(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    opts: &StreamOpts,
) -> Result<StreamResponse, String> {
    let deadline = Instant::now() + opts.timeout;
    let stream = connect(port, opts.timeout)?;
    let mut h = headers.to_vec();
    h.push(("connection", "close"));
    let t0 = Instant::now();
    write_request(&stream, port, "POST", path, &h, body)?;
    let mut reader = BufReader::new(stream);
    let head = read_head(&mut reader, deadline)?;
    let mut pieces = Vec::new();
    let mut total = 0usize;
    let mut aborted = false;
    let kind = body_kind("POST", &head);
    let res = read_body(&mut reader, kind, deadline, &mut |b| {
        pieces.push(Piece {
            at: t0.elapsed(),
            data: b.to_vec(),
        });
        total += b.len();
        if opts.abort_after_bytes.is_some_and(|n| total >= n) {
            aborted = true;
            return false;
        }
        true
    });
    if aborted {
        let _ = reader.get_ref().shutdown(std::net::Shutdown::Both);
    }
    let (complete, error) = match res {
        Ok((c, _)) => (c, None),
        Err(e) => (false, Some(e)),
    };
    Ok(StreamResponse {
        status: head.status,
        headers: head.headers,
        pieces,
        complete,
        aborted,
        error,
    })
}

/// The `data:` payloads of an SSE body, in order (e.g. `{"id":…}` and `[DONE]`).
pub fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim().to_string())
        .collect()
}

/// The `event:` names of an SSE body, in order.
pub fn sse_events(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("event:"))
        .map(|d| d.trim().to_string())
        .collect()
}
