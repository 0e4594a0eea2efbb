//! Raw proxy-wasm ABI calls that return the host's status instead of panicking.
//!
//! The SDK's `hostcalls::*` helpers (proxy-wasm 0.2.5) panic on any status they did not expect — for
//! example reading a request header in the body phase (BadArgument) or a header that is not UTF-8 — and
//! a panic kills the worker's VM. This module declares the same imports and turns every status into a
//! `Result`, so the adapter decides what a failure means. It is the only `unsafe` in the crate.
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
unsafe fn owned(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() || size == 0 {
        Vec::new()
    } else {
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
    unsafe {
        proxy_log(level as u32, msg.as_ptr(), msg.len());
    }
}

/// Host time, ns since the epoch.
pub fn now_ns() -> Result<u64, Status> {
    let mut t: u64 = 0;
    status(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

/// Sets the root context's tick period (0 = off).
pub fn set_tick_period_ms(ms: u32) -> Result<(), Status> {
    status(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// Reads `[start, start+max)` of a buffer; empty when absent.
pub fn get_buffer(b: Buffer, start: usize, max: usize) -> Result<Vec<u8>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    match unsafe { proxy_get_buffer_bytes(b as u32, start, max, &mut data, &mut size) } {
        OK => Ok(unsafe { owned(data, size) }),
        NOT_FOUND => Ok(Vec::new()),
        s => Err(s),
    }
}

/// Replaces `[start, start+size)` of a buffer with `data`.
pub fn set_buffer(b: Buffer, start: usize, size: usize, data: &[u8]) -> Result<(), Status> {
    status(unsafe { proxy_set_buffer_bytes(b as u32, start, size, data.as_ptr(), data.len()) })
}

/// A header value as bytes (`None` when absent).
pub fn get_header_bytes(m: Map, key: &str) -> Result<Option<Vec<u8>>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    match unsafe {
        proxy_get_header_map_value(m as u32, key.as_ptr(), key.len(), &mut data, &mut size)
    } {
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

/// Every header of a map in one host call (names are lower case; values decoded lossily).
pub fn get_headers(m: Map) -> Vec<(String, String)> {
    let mut data = null_mut();
    let mut size = 0usize;
    match unsafe { proxy_get_header_map_pairs(m as u32, &mut data, &mut size) } {
        OK => deserialize_map(&unsafe { owned(data, size) }),
        _ => Vec::new(),
    }
}

/// Looks a header up in a list from [`get_headers`].
pub fn find<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Appends a header.
pub fn add_header(m: Map, key: &str, val: &str) -> Result<(), Status> {
    status(unsafe {
        proxy_add_header_map_value(m as u32, key.as_ptr(), key.len(), val.as_ptr(), val.len())
    })
}

/// Sets a header, replacing any value.
pub fn set_header(m: Map, key: &str, val: &str) -> Result<(), Status> {
    status(unsafe {
        proxy_replace_header_map_value(m as u32, key.as_ptr(), key.len(), val.as_ptr(), val.len())
    })
}

/// Removes a header.
pub fn remove_header(m: Map, key: &str) -> Result<(), Status> {
    status(unsafe { proxy_remove_header_map_value(m as u32, key.as_ptr(), key.len()) })
}

/// Shared data: value and CAS, `None` when the key does not exist.
pub fn get_shared(key: &str) -> Result<Option<(Vec<u8>, u32)>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    let mut cas = 0u32;
    match unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) }
    {
        OK => Ok(Some((unsafe { owned(data, size) }, cas))),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

/// Shared data write with CAS (0 = unconditional).
pub fn set_shared(key: &str, val: &[u8], cas: u32) -> Result<(), Status> {
    status(unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), val.as_ptr(), val.len(), cas) })
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

/// Parses the ABI's map format (for callout response headers).
pub fn deserialize_map(bytes: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(n) = crate::store::read_u32(bytes, 0) else {
        return out;
    };
    let n = n as usize;
    let mut lens = Vec::new();
    for i in 0..n {
        let (Some(k), Some(v)) = (
            crate::store::read_u32(bytes, i.saturating_mul(8).saturating_add(4)),
            crate::store::read_u32(bytes, i.saturating_mul(8).saturating_add(8)),
        ) else {
            return out;
        };
        lens.push((k as usize, v as usize));
    }
    let mut p = 4usize.saturating_add(n.saturating_mul(8));
    for (kl, vl) in lens {
        let k_end = p.saturating_add(kl);
        let k = bytes.get(p..k_end);
        p = k_end.saturating_add(1);
        let v_end = p.saturating_add(vl);
        let v = bytes.get(p..v_end);
        p = v_end.saturating_add(1);
        match (k, v) {
            (Some(k), Some(v)) => out.push((
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )),
            _ => break,
        }
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
    status(unsafe { proxy_continue_stream(0) })
}

/// Makes `id` the effective context (to resume another HTTP context from the root's tick).
pub fn set_effective_context(id: u32) -> Result<(), Status> {
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
    status(unsafe { proxy_define_metric(t as u32, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Adds to a counter or gauge.
pub fn increment_metric(id: u32, by: i64) {
    unsafe {
        proxy_increment_metric(id, by);
    }
}

/// Sets a gauge or records a histogram sample.
pub fn record_metric(id: u32, value: u64) {
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
    status(unsafe { proxy_set_property(p.as_ptr(), p.len(), value.as_ptr(), value.len()) })
}

/// Reads a property (e.g. `["xds", "cluster_name"]`).
pub fn get_property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let p = path_bytes(path);
    let mut data = null_mut();
    let mut size = 0usize;
    match unsafe { proxy_get_property(p.as_ptr(), p.len(), &mut data, &mut size) } {
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
        let b = serialize_map(&pairs);
        let back = deserialize_map(&b);
        assert_eq!(back.len(), 3);
        assert_eq!(
            back[2],
            ("content-type".to_string(), "application/json".to_string())
        );
    }

    #[test]
    fn truncated_maps_do_not_panic() {
        let b = serialize_map(&[("abc", "def")]);
        for i in 0..b.len() {
            let _ = deserialize_map(&b[..i]);
        }
        let _ = deserialize_map(&[255, 255, 255, 255]);
    }
}
