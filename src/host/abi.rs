//! Raw proxy-wasm ABI calls that return the host's status instead of panicking.
//!
//! The SDK's `hostcalls::*` helpers (proxy-wasm 0.2.5) panic on any status they did not expect — for
//! example reading a request header in the body phase (BadArgument) or a header that is not UTF-8 — and
//! a panic kills the worker's VM. This module declares the same imports and turns every status into a
//! `Result`, so the adapter decides what a failure means. It is the only `unsafe` in the crate (the crate
//! root denies `unsafe_code`; this module's `allow` is the one exception), and every `unsafe` block says
//! why it is sound in a `// SAFETY:` comment (`clippy::undocumented_unsafe_blocks` is denied).
#![allow(clashing_extern_declarations, unsafe_code)]

use std::ptr::{null, null_mut};

/// A proxy-wasm status other than Ok.
pub type Status = u32;
const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
/// Status of a CAS conflict on shared data.
pub const CAS_MISMATCH: u32 = 8;

/// Header map types.
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum Map {
    /// Request headers (only in the headers phase).
    RequestHeaders = 0,
    /// Response headers.
    ResponseHeaders = 2,
    /// Headers of a callout's response.
    CallResponseHeaders = 6,
}

/// Buffer types.
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum Buffer {
    /// The request body.
    RequestBody = 0,
    /// The response body (current chunk).
    ResponseBody = 1,
    /// A callout's response body.
    CallResponseBody = 4,
    /// The plugin configuration.
    PluginConfiguration = 7,
}

// The host's imports (proxy-wasm ABI 0.2.1). Every call below passes (pointer, length) pairs of slices
// that stay alive until the call returns (the host copies what it keeps) and pointers to live locals for
// the host to write its results into; a buffer the host returns is handed over to us (see `owned`).
#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(ret: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        t: u32,
        start: usize,
        max: usize,
        ret_data: *mut *mut u8,
        ret_size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        t: u32,
        start: usize,
        size: usize,
        data: *const u8,
        len: usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        t: u32,
        key: *const u8,
        key_len: usize,
        ret_data: *mut *mut u8,
        ret_size: *mut usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        t: u32,
        key: *const u8,
        key_len: usize,
        val: *const u8,
        val_len: usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        t: u32,
        key: *const u8,
        key_len: usize,
        val: *const u8,
        val_len: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(t: u32, key: *const u8, key_len: usize) -> u32;
    fn proxy_get_header_map_pairs(t: u32, ret_data: *mut *mut u8, ret_size: *mut usize) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_len: usize,
        ret_data: *mut *mut u8,
        ret_size: *mut usize,
        ret_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_len: usize,
        val: *const u8,
        val_len: usize,
        cas: u32,
    ) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_set_effective_context(id: u32) -> u32;
    fn proxy_register_shared_queue(name: *const u8, name_len: usize, ret_token: *mut u32) -> u32;
    fn proxy_enqueue_shared_queue(token: u32, data: *const u8, data_len: usize) -> u32;
    fn proxy_dequeue_shared_queue(token: u32, ret_data: *mut *mut u8, ret_size: *mut usize) -> u32;
    fn proxy_define_metric(t: u32, name: *const u8, name_len: usize, ret_id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_set_property(path: *const u8, path_len: usize, val: *const u8, val_len: usize) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_len: usize,
        ret_data: *mut *mut u8,
        ret_size: *mut usize,
    ) -> u32;
    fn proxy_call_foreign_function(
        name: *const u8,
        name_len: usize,
        args: *const u8,
        args_len: usize,
        ret_data: *mut *mut u8,
        ret_size: *mut usize,
    ) -> u32;
}

// Native builds (unit tests, benches) never call the host: every import answers "not found".
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::too_many_arguments, clippy::missing_safety_doc)]
mod native {
    pub unsafe fn proxy_log(_: u32, _: *const u8, _: usize) -> u32 {
        0
    }
    pub unsafe fn proxy_get_current_time_nanoseconds(_: *mut u64) -> u32 {
        1
    }
    pub unsafe fn proxy_set_tick_period_milliseconds(_: u32) -> u32 {
        1
    }
    pub unsafe fn proxy_get_buffer_bytes(
        _: u32,
        _: usize,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_set_buffer_bytes(
        _: u32,
        _: usize,
        _: usize,
        _: *const u8,
        _: usize,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_get_header_map_value(
        _: u32,
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_add_header_map_value(
        _: u32,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_replace_header_map_value(
        _: u32,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_remove_header_map_value(_: u32, _: *const u8, _: usize) -> u32 {
        1
    }
    pub unsafe fn proxy_get_header_map_pairs(_: u32, _: *mut *mut u8, _: *mut usize) -> u32 {
        1
    }
    pub unsafe fn proxy_get_shared_data(
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
        _: *mut u32,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_set_shared_data(
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: u32,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_send_local_response(
        _: u32,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: i32,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_continue_stream(_: u32) -> u32 {
        1
    }
    pub unsafe fn proxy_set_effective_context(_: u32) -> u32 {
        1
    }
    pub unsafe fn proxy_register_shared_queue(_: *const u8, _: usize, _: *mut u32) -> u32 {
        1
    }
    pub unsafe fn proxy_enqueue_shared_queue(_: u32, _: *const u8, _: usize) -> u32 {
        1
    }
    pub unsafe fn proxy_dequeue_shared_queue(_: u32, _: *mut *mut u8, _: *mut usize) -> u32 {
        1
    }
    pub unsafe fn proxy_define_metric(_: u32, _: *const u8, _: usize, _: *mut u32) -> u32 {
        1
    }
    pub unsafe fn proxy_increment_metric(_: u32, _: i64) -> u32 {
        1
    }
    pub unsafe fn proxy_record_metric(_: u32, _: u64) -> u32 {
        1
    }
    pub unsafe fn proxy_set_property(_: *const u8, _: usize, _: *const u8, _: usize) -> u32 {
        1
    }
    pub unsafe fn proxy_get_property(
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        1
    }
    pub unsafe fn proxy_call_foreign_function(
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        1
    }
}
#[cfg(not(target_arch = "wasm32"))]
use native::*;

fn status(s: u32) -> Result<(), Status> {
    if s == OK {
        Ok(())
    } else {
        Err(s)
    }
}

/// Takes ownership of a host-allocated buffer (allocated through the SDK's `proxy_on_memory_allocate`).
///
/// # Safety
/// `data` must be null, or point to `size` bytes that the host returned from a call that succeeded and
/// that nothing else owns: the SDK's `proxy_on_memory_allocate` allocates them as a `Vec<u8>` with
/// exactly `size` capacity and forgets it, so rebuilding that `Vec` here (once per returned buffer) is
/// what frees it. A null pointer or a zero size gives an empty `Vec` and touches nothing.
unsafe fn owned(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() || size == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller guarantees `data` is a leaked `Vec<u8>` of capacity and length `size`.
        Vec::from_raw_parts(data, size, size)
    }
}

/// Log levels of the ABI.
#[derive(Clone, Copy)]
pub enum Level {
    /// debug
    Debug = 1,
    /// info
    Info = 2,
    /// warn
    Warn = 3,
    /// error
    Error = 4,
    /// critical
    Critical = 5,
}

/// Writes one log line.
pub fn log(level: Level, msg: &str) {
    // SAFETY: (pointer, length) of `msg`, a live `&str` for the whole call; the host only reads it.
    unsafe {
        proxy_log(level as u32, msg.as_ptr(), msg.len());
    }
}

/// Host time, ns since the epoch.
pub fn now_ns() -> Result<u64, Status> {
    let mut t: u64 = 0;
    // SAFETY: the host writes one u64 through a pointer to a live local.
    status(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

/// Sets the root context's tick period (0 = off).
pub fn set_tick_period_ms(ms: u32) -> Result<(), Status> {
    // SAFETY: an integer argument; no memory is shared.
    status(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// Reads `[start, start+max)` of a buffer; empty when absent.
pub fn get_buffer(b: Buffer, start: usize, max: usize) -> Result<Vec<u8>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: the host writes a pointer and a length into two live locals.
    match unsafe { proxy_get_buffer_bytes(b as u32, start, max, &mut data, &mut size) } {
        // SAFETY: on OK the host handed over `size` bytes it allocated through the SDK's
        // `proxy_on_memory_allocate`; `owned` takes them over, once.
        OK => Ok(unsafe { owned(data, size) }),
        NOT_FOUND => Ok(Vec::new()),
        s => Err(s),
    }
}

/// Replaces `[start, start+size)` of a buffer with `data`.
pub fn set_buffer(b: Buffer, start: usize, size: usize, data: &[u8]) -> Result<(), Status> {
    // SAFETY: (pointer, length) of `data`, a live slice for the whole call; the host copies it.
    status(unsafe { proxy_set_buffer_bytes(b as u32, start, size, data.as_ptr(), data.len()) })
}

/// A header value as bytes (`None` when absent).
pub fn get_header_bytes(m: Map, key: &str) -> Result<Option<Vec<u8>>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: (pointer, length) of `key`, live for the whole call; the host writes a pointer and a
    // length into two live locals.
    match unsafe {
        proxy_get_header_map_value(m as u32, key.as_ptr(), key.len(), &mut data, &mut size)
    } {
        // SAFETY: on OK the host handed over `size` bytes it allocated through the SDK's
        // `proxy_on_memory_allocate`; `owned` takes them over, once.
        OK => Ok(Some(unsafe { owned(data, size) })),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// A header value as UTF-8 (`None` when absent or not UTF-8).
pub fn get_header(m: Map, key: &str) -> Option<String> {
    get_header_bytes(m, key)
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}

/// Every header of a map, read in one host call and kept as the host's serialized blob: lookups borrow
/// from it, nothing is copied per header (the per-header `String`s of a parsed list cost more than the
/// host call itself).
pub struct HeaderBlob {
    bytes: Vec<u8>,
}

impl HeaderBlob {
    /// Reads map `m` (empty when the host refuses). A value that is not UTF-8 reads as its lossy
    /// decoding, as Envoy's own string accessors would show it.
    pub fn get(m: Map) -> HeaderBlob {
        let mut data = null_mut();
        let mut size = 0usize;
        // SAFETY: the host writes a pointer and a length into two live locals.
        let bytes = match unsafe { proxy_get_header_map_pairs(m as u32, &mut data, &mut size) } {
            // SAFETY: on OK the host handed over `size` bytes it allocated through the SDK's
            // `proxy_on_memory_allocate`; `owned` takes them over, once.
            OK => unsafe { owned(data, size) },
            _ => Vec::new(),
        };
        HeaderBlob::from_bytes(bytes)
    }

    /// Wraps a serialized map; rebuilt lossily (rare) when a name or value is not UTF-8.
    pub fn from_bytes(bytes: Vec<u8>) -> HeaderBlob {
        let blob = HeaderBlob { bytes };
        if blob
            .entries()
            .all(|(k, v)| std::str::from_utf8(k).is_ok() && std::str::from_utf8(v).is_ok())
        {
            return blob;
        }
        let owned: Vec<(String, String)> = blob
            .entries()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(k).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect();
        let pairs: Vec<(&str, &str)> = owned
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        HeaderBlob {
            bytes: serialize_map(&pairs),
        }
    }

    /// (name, value) byte slices in order; stops at the first entry the blob does not hold in full.
    fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let b = &self.bytes;
        let n = crate::store::read_u32(b, 0).unwrap_or(0) as usize;
        let mut p = 4usize.saturating_add(n.saturating_mul(8));
        (0..n).map_while(move |i| {
            let at = i.saturating_mul(8).saturating_add(4);
            let kl = crate::store::read_u32(b, at)? as usize;
            let vl = crate::store::read_u32(b, at.saturating_add(4))? as usize;
            let k_end = p.saturating_add(kl);
            let k = b.get(p..k_end)?;
            let v_start = k_end.saturating_add(1);
            let v_end = v_start.saturating_add(vl);
            let v = b.get(v_start..v_end)?;
            p = v_end.saturating_add(1);
            Some((k, v))
        })
    }

    /// The first value of header `name` (lower case).
    pub fn find(&self, name: &str) -> Option<&str> {
        self.entries()
            .find(|(k, _)| *k == name.as_bytes())
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// Whether header `name` (lower case) comes more than once with different values.
    pub fn differs(&self, name: &str) -> bool {
        let mut values = self
            .entries()
            .filter(|(k, _)| *k == name.as_bytes())
            .map(|(_, v)| v);
        let first = values.next();
        values.any(|v| Some(v) != first)
    }
}

/// Appends a header.
pub fn add_header(m: Map, key: &str, val: &str) -> Result<(), Status> {
    // SAFETY: (pointer, length) of `key` and of `val`, live for the whole call; the host copies
    // them.
    status(unsafe {
        proxy_add_header_map_value(m as u32, key.as_ptr(), key.len(), val.as_ptr(), val.len())
    })
}

/// Sets a header, replacing any value.
pub fn set_header(m: Map, key: &str, val: &str) -> Result<(), Status> {
    // SAFETY: (pointer, length) of `key` and of `val`, live for the whole call; the host copies
    // them.
    status(unsafe {
        proxy_replace_header_map_value(m as u32, key.as_ptr(), key.len(), val.as_ptr(), val.len())
    })
}

/// Removes a header.
pub fn remove_header(m: Map, key: &str) -> Result<(), Status> {
    // SAFETY: (pointer, length) of `key`, live for the whole call; the host only reads it.
    status(unsafe { proxy_remove_header_map_value(m as u32, key.as_ptr(), key.len()) })
}

/// Shared data: value and CAS, `None` when the key does not exist.
pub fn get_shared(key: &str) -> Result<Option<(Vec<u8>, u32)>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    let mut cas = 0u32;
    // SAFETY: (pointer, length) of `key`, live for the whole call; the host writes a pointer, a
    // length and the CAS into three live locals.
    match unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) }
    {
        // SAFETY: on OK the host handed over `size` bytes it allocated through the SDK's
        // `proxy_on_memory_allocate`; `owned` takes them over, once.
        OK => Ok(Some((unsafe { owned(data, size) }, cas))),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// Shared data write with CAS (0 = unconditional).
pub fn set_shared(key: &str, val: &[u8], cas: u32) -> Result<(), Status> {
    // SAFETY: (pointer, length) of `key` and of `val`, live for the whole call; the host copies
    // them.
    status(unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), val.as_ptr(), val.len(), cas) })
}

/// Registers (or finds) this VM's shared queue `name`: its `on_queue_ready` comes to this VM's root
/// context. Returns its token.
pub fn register_shared_queue(name: &str) -> Result<u32, Status> {
    let mut token = 0u32;
    // SAFETY: (pointer, length) of `name`, live for the whole call; the host writes the token into a
    // live local.
    status(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut token) })?;
    Ok(token)
}

/// Enqueues `data` on shared queue `token` (the queue's VM gets `on_queue_ready`).
pub fn enqueue_shared_queue(token: u32, data: &[u8]) -> Result<(), Status> {
    // SAFETY: (pointer, length) of `data`, live for the whole call; the host copies it.
    status(unsafe { proxy_enqueue_shared_queue(token, data.as_ptr(), data.len()) })
}

/// Dequeues one item of shared queue `token` (`None` when it is empty).
pub fn dequeue_shared_queue(token: u32) -> Result<Option<Vec<u8>>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: the host writes a pointer and a length into two live locals.
    match unsafe { proxy_dequeue_shared_queue(token, &mut data, &mut size) } {
        // SAFETY: on OK the host handed over `size` bytes it allocated through the SDK's
        // `proxy_on_memory_allocate`; `owned` takes them over, once.
        OK => Ok(Some(unsafe { owned(data, size) })),
        // Empty (the ABI's `Empty` status).
        7 => Ok(None),
        s => Err(s),
    }
}

/// Serializes a header list in the ABI's map format.
pub fn serialize_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut size = 4usize;
    for (k, v) in pairs {
        size += 8 + k.len() + v.len() + 2;
    }
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Sends a local reply instead of forwarding.
pub fn send_local_response(
    code: u32,
    headers: &[(&str, &str)],
    body: &[u8],
    details: &str,
) -> Result<(), Status> {
    let h = serialize_map(headers);
    // SAFETY: (pointer, length) of `details`, of `body` (null with length 0 when empty) and of the
    // serialized headers `h`, all alive until the call returns; the host copies them.
    status(unsafe {
        proxy_send_local_response(
            code,
            details.as_ptr(),
            details.len(),
            if body.is_empty() {
                null()
            } else {
                body.as_ptr()
            },
            body.len(),
            h.as_ptr(),
            h.len(),
            -1,
        )
    })
}

/// Resumes the request stream of the effective context.
pub fn resume_request() -> Result<(), Status> {
    // SAFETY: an integer argument; no memory is shared.
    status(unsafe { proxy_continue_stream(0) })
}

/// Makes `id` the effective context (to resume another HTTP context from the root's tick).
pub fn set_effective_context(id: u32) -> Result<(), Status> {
    // SAFETY: an integer argument; no memory is shared.
    status(unsafe { proxy_set_effective_context(id) })
}

/// Metric types.
#[derive(Clone, Copy)]
pub enum MetricType {
    /// monotonically increasing
    Counter = 0,
    /// set to a value
    Gauge = 1,
    /// recorded samples
    Histogram = 2,
}

/// Defines (or finds) a metric.
pub fn define_metric(t: MetricType, name: &str) -> Result<u32, Status> {
    let mut id = 0u32;
    // SAFETY: (pointer, length) of `name`, live for the whole call; the host writes the id into a
    // live local.
    status(unsafe { proxy_define_metric(t as u32, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Adds to a counter or gauge.
pub fn increment_metric(id: u32, by: i64) {
    // SAFETY: integer arguments; no memory is shared.
    unsafe {
        proxy_increment_metric(id, by);
    }
}

/// Sets a gauge or records a histogram sample.
pub fn record_metric(id: u32, value: u64) {
    // SAFETY: integer arguments; no memory is shared.
    unsafe {
        proxy_record_metric(id, value);
    }
}

fn path_bytes(path: &[&str]) -> Vec<u8> {
    // Segments joined by NUL, without a trailing one (Envoy would make it part of the last segment).
    let mut p = Vec::new();
    for (i, seg) in path.iter().enumerate() {
        if i > 0 {
            p.push(0);
        }
        p.extend_from_slice(seg.as_bytes());
    }
    p
}

/// Sets a property (filter state `wasm.<name>` for a one-segment path).
pub fn set_property(path: &[&str], value: &[u8]) -> Result<(), Status> {
    let p = path_bytes(path);
    // SAFETY: (pointer, length) of the path `p` and of `value`, live for the whole call; the host
    // copies them.
    status(unsafe { proxy_set_property(p.as_ptr(), p.len(), value.as_ptr(), value.len()) })
}

/// Reads a property (e.g. `["xds", "cluster_name"]`).
pub fn get_property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let p = path_bytes(path);
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: (pointer, length) of the path `p`, live for the whole call; the host writes a pointer
    // and a length into two live locals.
    match unsafe { proxy_get_property(p.as_ptr(), p.len(), &mut data, &mut size) } {
        // SAFETY: on OK the host handed over `size` bytes it allocated through the SDK's
        // `proxy_on_memory_allocate`; `owned` takes them over, once.
        OK => Ok(Some(unsafe { owned(data, size) })),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// Starts an HTTP callout; returns its token.
///
/// This one goes through the SDK: its dispatcher must learn the token to route the response back to
/// the calling context (an unknown token makes the SDK panic). The SDK call returns `Err` for the
/// statuses Envoy gives (BadArgument: unknown cluster or missing pseudo-headers; InternalFailure).
pub fn dispatch_http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u32,
) -> Result<u32, Status> {
    proxy_wasm::hostcalls::dispatch_http_call(
        cluster,
        headers.to_vec(),
        Some(body),
        Vec::new(),
        std::time::Duration::from_millis(u64::from(timeout_ms)),
    )
    .map_err(|s| s as u32)
}

/// Headers of the callout response being delivered (all of them).
pub fn call_response_headers() -> Vec<(String, String)> {
    // proxy_get_header_map_pairs is not declared here; the status header is all the callers need.
    get_header(Map::CallResponseHeaders, ":status")
        .map(|s| vec![(":status".to_string(), s)])
        .unwrap_or_default()
}

/// Calls a host foreign function (e.g. `clear_route_cache`).
pub fn call_foreign_function(name: &str, args: &[u8]) -> Result<Vec<u8>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: (pointer, length) of `name` and of `args`, live for the whole call; the host writes a
    // pointer and a length into two live locals.
    match unsafe {
        proxy_call_foreign_function(
            name.as_ptr(),
            name.len(),
            args.as_ptr(),
            args.len(),
            &mut data,
            &mut size,
        )
    } {
        // SAFETY: on OK the host handed over `size` bytes it allocated through the SDK's
        // `proxy_on_memory_allocate`; `owned` takes them over, once.
        OK => Ok(unsafe { owned(data, size) }),
        NOT_FOUND => Ok(Vec::new()),
        s => Err(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_round_trip_through_the_abi_format() {
        let pairs = [
            (":status", "200"),
            ("x", ""),
            ("content-type", "application/json"),
        ];
        let blob = HeaderBlob::from_bytes(serialize_map(&pairs));
        assert_eq!(blob.entries().count(), 3);
        assert_eq!(blob.find("content-type"), Some("application/json"));
        assert_eq!(blob.find("x"), Some(""));
        assert_eq!(blob.find(":status"), Some("200"));
        assert_eq!(blob.find("missing"), None);
    }

    #[test]
    fn non_utf8_values_read_lossily() {
        let mut b = serialize_map(&[("a", "xy"), ("t", "ok")]);
        // The value of "a" starts after the count, two length pairs and "a\0".
        let at = 4 + 16 + 2;
        b[at] = 0xff;
        let blob = HeaderBlob::from_bytes(b);
        assert_eq!(blob.find("a"), Some("\u{fffd}y"));
        assert_eq!(blob.find("t"), Some("ok"));
    }

    #[test]
    fn truncated_maps_do_not_panic() {
        let b = serialize_map(&[("abc", "def"), ("g", "h")]);
        for i in 0..b.len() {
            let blob = HeaderBlob::from_bytes(b[..i].to_vec());
            assert!(blob.entries().count() <= 2);
            let _ = blob.find("abc");
        }
        let blob = HeaderBlob::from_bytes(vec![255, 255, 255, 255]);
        assert_eq!(blob.find("abc"), None);
    }
}
