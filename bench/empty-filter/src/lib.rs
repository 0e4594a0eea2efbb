//! empty-filter: a root context and an HTTP context that do nothing but return `Continue`.
//!
//! `make bench` runs Envoy with this filter next to tokengate so that the table shows what tokengate
//! itself costs on top of the fixed price of a wasm filter (VM call per callback, header copies).

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(EmptyRoot) });
}}

/// Accepts any configuration and creates one `EmptyHttp` per request.
struct EmptyRoot;

impl Context for EmptyRoot {}

impl RootContext for EmptyRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(EmptyHttp))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Lets every request and response through untouched.
struct EmptyHttp;

impl Context for EmptyHttp {}

impl HttpContext for EmptyHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }

    fn on_http_request_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }

    fn on_http_response_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
}
