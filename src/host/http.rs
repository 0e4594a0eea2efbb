//! The HTTP context: one per request. It shows the pure flow ([`crate::flow::Request`]) what Envoy
//! shows and applies the effects it returns; every decision is the flow's.

use super::abi::{HeaderBlob, Map};
use super::effects::{call_reply, EnvoySink};
use super::{EnvoyHost, LazyHeaders, VM};
use crate::config::Config;
use crate::flow::apply::{apply, From};
use crate::flow::{CalloutReply, Cx, Effect, Next, Purpose, Request};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::cell::RefCell;
use std::rc::Rc;

/// What a request's callbacks share with the root, which continues a request whose answer it brings
/// ([`super::parked`]).
pub struct Stream {
    /// The flow's request.
    pub req: Request,
    /// Bytes of the request body as Envoy buffers it now (a replacement replaces all of it).
    pub request_body_len: usize,
}

/// One request's context.
pub struct Http {
    cfg: Option<Rc<Config>>,
    stream: Rc<RefCell<Stream>>,
    /// Bytes of the response chunk of the current callback.
    chunk_len: usize,
}

impl Http {
    /// A new context for request `id`.
    pub fn new(id: u32, cfg: Option<Rc<Config>>) -> Self {
        Http {
            cfg,
            stream: Rc::new(RefCell::new(Stream {
                req: Request::new(id),
                request_body_len: 0,
            })),
            chunk_len: 0,
        }
    }

    /// Runs one flow function with this VM's state, then applies its effects.
    fn run(&mut self, from: From, f: impl FnOnce(&mut Request, &mut Cx) -> Next) -> Action {
        let Some(cfg) = self.cfg.clone() else {
            return Action::Continue;
        };
        let stream = Rc::clone(&self.stream);
        let Ok(mut st) = stream.try_borrow_mut() else {
            return Action::Continue;
        };
        let (next, fx) = VM.with(|vm| {
            let mut vm = vm.borrow_mut();
            let vm = &mut *vm;
            let mut cx = Cx {
                cfg: &cfg,
                host: &EnvoyHost::new(),
                worker: &mut vm.worker,
                fx: &mut vm.fx,
            };
            let next = f(&mut st.req, &mut cx);
            (next, std::mem::take(&mut vm.fx))
        });
        let action = apply_fx(&cfg, &mut st, self.chunk_len, None, from, next, fx);
        if st.req.waits_on_root() {
            let id = st.req.id();
            VM.with(|vm| {
                if let Ok(mut vm) = vm.try_borrow_mut() {
                    vm.parked.insert(id, Rc::clone(&self.stream));
                }
            });
        }
        action
    }
}

/// Applies a request's effects in order ([`crate::flow::apply`]). A callout the host refuses is
/// answered at once ([`CalloutReply::refused`]), which may add effects. `owner`: the request's context
/// id when the root runs it ([`super::parked`]).
pub(super) fn apply_fx(
    cfg: &Rc<Config>,
    st: &mut Stream,
    chunk_len: usize,
    owner: Option<u32>,
    from: From,
    next: Next,
    mut fx: Vec<Effect>,
) -> Action {
    {
        let mut sink = EnvoySink {
            request_body_len: st.request_body_len,
            chunk_len,
            root: false,
            owner,
        };
        let req = &mut st.req;
        let mut deliver = |_: Purpose, reply: CalloutReply| -> Vec<Effect> {
            VM.with(|vm| {
                let mut vm = vm.borrow_mut();
                let vm = &mut *vm;
                let mut cx = Cx {
                    cfg,
                    host: &EnvoyHost::new(),
                    worker: &mut vm.worker,
                    fx: &mut vm.fx,
                };
                req.on_callout_reply(&mut cx, reply);
                std::mem::take(&mut vm.fx)
            })
        };
        let next = apply(&mut sink, from, next, &mut fx, &mut deliver);
        st.request_body_len = sink.request_body_len;
        // Give the buffer back for the next request (keeps its capacity).
        VM.with(|vm| {
            if let Ok(mut vm) = vm.try_borrow_mut() {
                if vm.fx.capacity() < fx.capacity() {
                    vm.fx = fx;
                }
            }
        });
        match next {
            Next::Continue => Action::Continue,
            Next::Pause => Action::Pause,
        }
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        let Ok(st) = self.stream.try_borrow() else {
            return;
        };
        let id = st.req.id();
        let held = st.req.is_held();
        VM.with(|vm| {
            if let Ok(mut vm) = vm.try_borrow_mut() {
                if held {
                    vm.worker.forget(id);
                }
                // The root no longer continues it (its answer, if one comes, is dropped).
                if vm.parked.remove(&id).is_some() {
                    vm.worker.batch.discard(id);
                }
            }
        });
    }
}

impl Context for Http {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let reply = call_reply(body_size);
        self.run(From::Callout, |req, cx| {
            req.on_callout_reply(cx, reply);
            Next::Pause
        });
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // One host call for every header this request needs (pseudo-headers included).
        let headers = HeaderBlob::get(Map::RequestHeaders);
        self.run(From::Stream, |req, cx| {
            req.on_request_headers(cx, &headers, end_of_stream)
        })
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Ok(mut st) = self.stream.try_borrow_mut() {
            st.request_body_len = body_size;
        }
        self.run(From::Stream, |req, cx| {
            req.on_request_body(cx, body_size, end_of_stream)
        })
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if !self.stream.borrow().req.sees_response() {
            return Action::Continue;
        }
        // Every response header this request looks at, in one host call, if it looks at any.
        let headers = LazyHeaders::new(Map::ResponseHeaders);
        self.run(From::Stream, |req, cx| {
            req.on_response_headers(cx, &headers, end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.stream.borrow().req.wants_response_body(end_of_stream) {
            return Action::Continue;
        }
        self.chunk_len = body_size;
        self.run(From::Stream, |req, cx| {
            req.on_response_body(cx, body_size, end_of_stream)
        })
    }

    fn on_log(&mut self) {
        if !self.stream.borrow().req.has_end_work() {
            return;
        }
        self.run(From::Callout, |req, cx| {
            req.on_log(cx);
            Next::Continue
        });
    }
}
