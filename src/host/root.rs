//! Root context: loads the configuration, defines metrics, runs the flow's tick (held requests,
//! settlements, credits) and its callouts, and creates one [`Http`] context per request.

use super::abi::{self, Buffer, Level};
use super::effects::{call_reply, EnvoySink};
use super::http::Http;
use super::{metrics, parked, EnvoyHost, VM};
use crate::config::{self, Config};
use crate::flow::apply::{apply, From};
use crate::flow::vm::tick;
use crate::flow::{CalloutReply, Cx, Effect, Next, Purpose};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;

/// The build, logged once when a VM starts.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("TOKENGATE_GIT_REV"),
    ")"
);

/// The root context of one VM.
#[derive(Default)]
pub struct Root {
    cfg: Option<Rc<Config>>,
}

impl Root {
    /// Runs a worker function and applies its effects ([`crate::flow::apply`]).
    fn run(&mut self, f: impl FnOnce(&mut Cx)) {
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let mut fx = VM.with(|vm| {
            let mut vm = vm.borrow_mut();
            let vm = &mut *vm;
            let mut cx = Cx {
                cfg: &cfg,
                host: &EnvoyHost::new(),
                worker: &mut vm.worker,
                fx: &mut vm.fx,
            };
            f(&mut cx);
            std::mem::take(&mut vm.fx)
        });
        let mut sink = EnvoySink {
            request_body_len: 0,
            chunk_len: 0,
            root: true,
            owner: None,
        };
        let mut deliver = |purpose, reply| worker_reply(&cfg, purpose, reply);
        apply(
            &mut sink,
            From::Callout,
            Next::Continue,
            &mut fx,
            &mut deliver,
        );
    }
}

/// Delivers a root callout reply to the worker; returns its effects.
fn worker_reply(cfg: &Config, purpose: Purpose, reply: CalloutReply) -> Vec<Effect> {
    VM.with(|vm| {
        let mut vm = vm.borrow_mut();
        let vm = &mut *vm;
        let mut cx = Cx {
            cfg,
            host: &EnvoyHost::new(),
            worker: &mut vm.worker,
            fx: &mut vm.fx,
        };
        tick::on_callout_reply(&mut cx, purpose, reply);
        std::mem::take(&mut vm.fx)
    })
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(purpose) = VM.with(|vm| vm.borrow_mut().root_callouts.remove(&token)) else {
            // A callout of a request the root continues (its answer goes on with the request).
            if let Some(cfg) = self.cfg.clone() {
                parked::callout_answered(&cfg, token, call_reply(body_size));
                parked::continue_ready(&cfg);
            }
            return;
        };
        let reply = call_reply(body_size);
        self.run(|cx| tick::on_callout_reply(cx, purpose, reply));
        self.continue_parked();
    }

    fn on_done(&mut self) -> bool {
        self.run(tick::on_done);
        true
    }
}

impl Root {
    /// Continues the requests whose batched reservations answered ([`parked`]).
    fn continue_parked(&self) {
        if let Some(cfg) = self.cfg.as_ref() {
            if VM.with(|vm| !vm.borrow().worker.batch.ready.is_empty()) {
                parked::continue_ready(cfg);
            }
        }
    }

    /// This VM's own shared queue, whose `on_queue_ready` wakes this root (batched reservations wait to
    /// be sent): one name per VM (the queue of a name belongs to the last VM that registers it).
    fn register_wake_queue(&self) {
        if VM.with(|vm| vm.borrow().wake_queue.is_some()) {
            return;
        }
        let Some(owner) = crate::store::claim::owner_id(&super::store::HostStore, 8) else {
            return;
        };
        match abi::register_shared_queue(&format!("tokengate.wake.{owner}")) {
            Ok(token) => VM.with(|vm| vm.borrow_mut().wake_queue = Some(token)),
            Err(s) => abi::log(
                Level::Warn,
                &format!("cannot register the wake queue (status {s}): batched reservations are sent at the tick"),
            ),
        }
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        metrics::init();
        abi::log(Level::Info, &format!("tokengate {VERSION} starting"));
        true
    }

    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        metrics::init();
        let bytes = match abi::get_buffer(Buffer::PluginConfiguration, 0, plugin_configuration_size)
        {
            Ok(b) => b,
            Err(s) => {
                abi::log(
                    Level::Error,
                    &format!("invalid configuration: cannot read it (status {s})"),
                );
                return false;
            }
        };
        match config::parse(&bytes) {
            Ok(cfg) => {
                if abi::set_tick_period_ms(tick::period_ms(&cfg)).is_err() {
                    abi::log(
                        Level::Warn,
                        "cannot set the tick period; shaping releases late",
                    );
                }
                abi::log(Level::Info, &format!("configured: {}", cfg.summary()));
                if cfg.quota.is_some() {
                    // Before traffic: a key Envoy creates ignores CAS (see crate::store::journal).
                    let _ = crate::store::journal::init(&super::store::HostStore);
                }
                let batching = cfg.quota.as_ref().is_some_and(|q| q.batch.is_some());
                self.cfg = Some(Rc::new(cfg));
                if batching {
                    self.register_wake_queue();
                }
                true
            }
            Err(e) => {
                abi::log(Level::Error, &format!("invalid configuration: {e}"));
                false
            }
        }
    }

    fn on_tick(&mut self) {
        self.run(tick::on_tick);
        self.continue_parked();
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        // Drained: one wake stands for every item.
        while let Ok(Some(_)) = abi::dequeue_shared_queue(queue_id) {}
        self.run(tick::on_wake);
        self.continue_parked();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http::new(context_id, self.cfg.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
