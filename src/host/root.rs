//! Root context: loads the configuration, defines metrics, releases held (shaped) requests on ticks, and
//! creates one [`Http`] context per request.

use super::abi::{self, Buffer, Level};
use super::http::Http;
use super::{global, log, metrics, now_ns, quota, VM};
use crate::config::{self, Config};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;

/// Tick period while shaping is configured: the granularity of releasing held requests.
pub const SHAPING_TICK_MS: u32 = 5;
/// Tick period for quota settlements alone.
pub const SETTLE_TICK_MS: u32 = 20;

/// The root context of one VM.
#[derive(Default)]
pub struct Root {
    cfg: Option<Rc<Config>>,
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let Some(cfg) = self.cfg.as_ref() else {
            return;
        };
        if let Some(g) = cfg.global.as_ref() {
            if global::on_credit_response(cfg, g, token_id, body_size) {
                return;
            }
        }
        if let Some(q) = cfg.quota.as_ref() {
            quota::on_settle_response(q, token_id, body_size);
        }
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        metrics::init();
        true
    }

    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        metrics::init();
        let bytes = match abi::get_buffer(Buffer::PluginConfiguration, 0, plugin_configuration_size)
        {
            Ok(b) => b,
            Err(s) => {
                log(
                    Level::Error,
                    &format!("invalid configuration: cannot read it (status {s})"),
                );
                return false;
            }
        };
        match config::parse(&bytes) {
            Ok(cfg) => {
                let tick = if cfg.shaping() {
                    SHAPING_TICK_MS
                } else if cfg.quota.is_some() || cfg.global.is_some() {
                    SETTLE_TICK_MS
                } else {
                    0
                };
                if abi::set_tick_period_ms(tick).is_err() {
                    log(
                        Level::Warn,
                        "cannot set the tick period; shaping releases late",
                    );
                }
                log(
                    Level::Info,
                    &format!("configured: {} bucket rules", cfg.rules.len()),
                );
                self.cfg = Some(Rc::new(cfg));
                true
            }
            Err(e) => {
                log(Level::Error, &format!("invalid configuration: {e}"));
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let now = now_ns();
        let due: Vec<u32> = VM.with(|vm| {
            let mut vm = vm.borrow_mut();
            let (due, keep): (Vec<_>, Vec<_>) = vm.held.iter().partition(|(_, at)| *at <= now);
            vm.held = keep;
            due.into_iter().map(|(id, _)| id).collect()
        });
        for id in due {
            // A context that went away (client gone) is simply not found.
            if abi::set_effective_context(id).is_ok() {
                let _ = abi::resume_request();
            }
        }
        if let Some(q) = self.cfg.as_ref().and_then(|c| c.quota.as_ref()) {
            quota::tick(q);
        }
        if let Some(cfg) = self.cfg.as_ref() {
            if let Some(g) = cfg.global.as_ref() {
                global::tick(cfg, g);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http::new(context_id, self.cfg.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
