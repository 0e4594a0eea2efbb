//! empty-filter: a root context and an HTTP context that do nothing but return `Continue`.
//!
//! `make bench` runs Envoy with this filter next to tokengate so that the table shows what tokengate
//! itself costs on top of the fixed price of a wasm filter (VM call per callback, header copies).
//!
//! Plugin configuration `buffer` (the whole StringValue, surrounding whitespace and quotes ignored) turns
//! on the second baseline, "empty wasm (buffer body)": the request body is held until end of stream
//! (`Pause` on partial chunks) and then copied once into the VM, which is the least any filter that
//! estimates cost from the body must do. Any other configuration keeps the plain pass-through filter.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(EmptyRoot { buffer: false }) });
}}

/// Accepts any configuration and creates one `EmptyHttp` per request.
struct EmptyRoot {
    /// Buffer and read the request body (configuration `buffer`).
    buffer: bool,
}

impl Context for EmptyRoot {}

impl RootContext for EmptyRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let text = String::from_utf8_lossy(&config);
        self.buffer = text.trim().trim_matches('"') == "buffer";
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(EmptyHttp {
            buffer: self.buffer,
            body_len: 0,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Lets every request and response through untouched (after reading the body in `buffer` mode).
struct EmptyHttp {
    buffer: bool,
    /// Bytes read in `buffer` mode (kept so the read cannot be optimised away).
    body_len: usize,
}

impl Context for EmptyHttp {}

impl HttpContext for EmptyHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
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
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }

    fn on_http_response_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
}
