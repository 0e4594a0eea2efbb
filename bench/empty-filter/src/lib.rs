//! empty-filter: a root context and an HTTP context that do nothing but return `Continue`.
//!
//! `make bench` runs Envoy with this filter next to tokengate so that the table shows what tokengate
//! itself costs on top of the fixed price of a wasm filter (VM call per callback, header copies).
//!
//! Plugin configuration `buffer` (the whole StringValue, surrounding whitespace and quotes ignored) turns
//! on the second baseline, "empty wasm (buffer body)": the request body is held until end of stream
//! (`Pause` on partial chunks) and then copied once into the VM, which is the least any filter that
//! estimates cost from the body must do.
//!
//! Configuration `floor` is the third baseline, "host-call floor": `buffer` plus exactly the host calls
//! that the response contract and a shared bucket cannot do without, with no logic around them: read
//! the request headers (tenant, path, method) in one call, one shared-data read and one CAS write of a
//! 25-byte bucket state, and the three `x-ratelimit-*-tokens` response headers. No filter that keeps a
//! bucket in shared data and answers with those headers can cost less than this row.
//!
//! `floor+<call>+<call>…` adds host calls to the floor, to price each kind in callgrind next to the
//! floor row (`BENCH_EXTRA="time=<this .wasm>|floor+time;…"`): `time` (a clock read), `prop` (the
//! `xds.cluster_name` property), `prop2` (the top-level `cluster_name`), `metric` (a counter
//! increment), `setprop` (a 53-byte filter-state property, as the audit record), `rmheader` (a request
//! header removed in the headers phase), `get` (a shared-data read of a missing key), `getbig` (a
//! shared-data read and CAS write of 238 bytes, a breaker record) and `hdr` (a fourth response
//! header). The prices measured are in `docs/benchmarks.md`.
//!
//! Any other configuration keeps the plain pass-through filter.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(EmptyRoot { buffer: false, floor: false, extra: Vec::new(), metric: 0 }) });
}}

/// Accepts any configuration and creates one `EmptyHttp` per request.
struct EmptyRoot {
    /// Buffer and read the request body (configuration `buffer` or `floor`).
    buffer: bool,
    /// Also make the contract's minimum host calls (configuration `floor`).
    floor: bool,
    /// Extra host calls on top of `floor` (configuration `floor+<call>+<call>…`), to price each kind.
    extra: Vec<String>,
    metric: u32,
}

impl Context for EmptyRoot {}

impl RootContext for EmptyRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let text = String::from_utf8_lossy(&config);
        let mode = text.trim().trim_matches('"');
        let mut parts = mode.split('+');
        let first = parts.next().unwrap_or_default();
        self.floor = first == "floor";
        self.buffer = first == "buffer" || self.floor;
        self.extra = parts.map(str::to_string).collect();
        if self.extra.iter().any(|e| e == "metric") {
            self.metric = proxy_wasm::hostcalls::define_metric(
                proxy_wasm::types::MetricType::Counter,
                "floor_metric",
            )
            .unwrap_or(0);
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(EmptyHttp {
            buffer: self.buffer,
            floor: self.floor,
            body_len: 0,
            extra: self.extra.clone(),
            metric: self.metric,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Lets every request and response through untouched (after reading the body in `buffer` mode).
struct EmptyHttp {
    buffer: bool,
    floor: bool,
    /// Bytes read in `buffer` mode (kept so the read cannot be optimised away).
    body_len: usize,
    extra: Vec<String>,
    metric: u32,
}

impl Context for EmptyHttp {}

impl HttpContext for EmptyHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.floor {
            self.body_len = std::hint::black_box(request_header_blob_len());
            if self.extra.iter().any(|e| e == "rmheader") {
                let _ = proxy_wasm::hostcalls::remove_map_value(
                    proxy_wasm::types::MapType::HttpRequestHeaders,
                    "x-tenant-id",
                );
            }
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.buffer {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        if let Some(body) = self.get_http_request_body(0, body_size) {
            self.body_len = std::hint::black_box(body.len());
        }
        if self.floor {
            let (state, cas) = self.get_shared_data("floor:bucket");
            let mut next = state.unwrap_or_else(|| vec![0u8; 25]);
            if let Some(b) = next.get_mut(1) {
                *b = b.wrapping_add(1);
            }
            let _ = self.set_shared_data("floor:bucket", Some(&next), cas);
            for e in &self.extra {
                match e.as_str() {
                    "time" => {
                        self.body_len ^= std::hint::black_box(self.get_current_time())
                            .elapsed()
                            .map(|d| d.as_nanos() as usize)
                            .unwrap_or(0);
                    }
                    "prop" => {
                        self.body_len ^= self
                            .get_property(vec!["xds", "cluster_name"])
                            .map_or(0, |v| v.len());
                    }
                    "prop2" => {
                        self.body_len ^= self
                            .get_property(vec!["cluster_name"])
                            .map_or(0, |v| v.len());
                    }
                    "metric" => {
                        let _ = proxy_wasm::hostcalls::increment_metric(self.metric, 1);
                    }
                    "setprop" => {
                        self.set_property(
                            vec!["floor_audit"],
                            Some(b"tenant=acme model=gpt-4.1 estimated=40 decision=admit"),
                        );
                    }
                    "get" => {
                        self.body_len ^=
                            self.get_shared_data("floor:other").0.map_or(0, |v| v.len());
                    }
                    "getbig" => {
                        let (v, cas) = self.get_shared_data("floor:big");
                        let v = v.unwrap_or_else(|| vec![0u8; 238]);
                        let _ = self.set_shared_data("floor:big", Some(&v), cas);
                    }
                    _ => {}
                }
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.floor {
            self.set_http_response_header("x-ratelimit-limit-tokens", Some("1000000000"));
            self.set_http_response_header("x-ratelimit-remaining-tokens", Some("999999000"));
            self.set_http_response_header("x-ratelimit-reset-tokens", Some("0s"));
            if self.extra.iter().any(|e| e == "hdr") {
                self.set_http_response_header("x-tokengate-estimated-tokens", Some("40"));
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
}

extern "C" {
    fn proxy_get_header_map_pairs(t: u32, ret_data: *mut *mut u8, ret_size: *mut usize) -> u32;
}

/// Reads every request header in one host call and frees the blob without parsing it (the least a
/// filter that needs a few request headers can do). Returns its size.
fn request_header_blob_len() -> usize {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: the host writes a pointer to `size` bytes it allocated with this module's allocator
    // (`proxy_on_memory_allocate`), which `Vec::from_raw_parts` takes back.
    unsafe {
        if proxy_get_header_map_pairs(0, &mut data, &mut size) == 0 && !data.is_null() {
            drop(Vec::from_raw_parts(data, size, size));
            return size;
        }
    }
    0
}
