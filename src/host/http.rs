//! The HTTP context: one per request. It shows the pure flow ([`crate::flow::Request`]) what Envoy
//! shows and applies the effects it returns; every decision is the flow's.

use super::abi::{self, Buffer, HeaderBlob, Level, Map};
use super::effects::{apply_common, call_reply, dispatch};
use super::{EnvoyHost, LazyHeaders, VM};
use crate::config::Config;
use crate::flow::{CalloutReply, Cx, Effect, Next, Request};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// Which callback the effects come from (what a resume or a reply means there).
#[derive(Clone, Copy, PartialEq, Eq)]
enum From {
    /// A stream callback: a resume is the callback returning Continue.
    Stream,
    /// A callout answer: a resume is `proxy_continue_stream`.
    Callout,
}

/// One request's context.
pub struct Http {
    cfg: Option<Rc<Config>>,
    req: Request,
    /// Bytes of the request body as Envoy buffers it now (a replacement replaces all of it).
    request_body_len: usize,
    /// Bytes of the response chunk of the current callback.
    chunk_len: usize,
}

impl Http {
    /// A new context for request `id`.
    pub fn new(id: u32, cfg: Option<Rc<Config>>) -> Self {
        Http {
            cfg,
            req: Request::new(id),
            request_body_len: 0,
            chunk_len: 0,
        }
    }

    /// Runs one flow function with this VM's state, then applies its effects.
    fn run(&mut self, from: From, f: impl FnOnce(&mut Request, &mut Cx) -> Next) -> Action {
        let Some(cfg) = self.cfg.clone() else {
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
            let next = f(&mut self.req, &mut cx);
            (next, std::mem::take(&mut vm.fx))
        });
        self.apply(&cfg, from, next, fx)
    }

    /// Applies effects in order. A callout the host refuses is answered at once
    /// ([`CalloutReply::refused`]), which may add effects.
    fn apply(
        &mut self,
        cfg: &Rc<Config>,
        from: From,
        mut next: Next,
        mut fx: Vec<Effect>,
    ) -> Action {
        let mut i = 0;
        while i < fx.len() {
            let Some(e) = fx.get_mut(i).map(|e| std::mem::replace(e, Effect::Resume)) else {
                break;
            };
            i += 1;
            let Some(e) = apply_common(e) else {
                continue;
            };
            match e {
                Effect::Reply { reply, details } => {
                    let headers: Vec<(&str, &str)> = reply
                        .headers
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    if let Err(s) =
                        abi::send_local_response(reply.status, &headers, &reply.body, details)
                    {
                        abi::log(
                            Level::Warn,
                            &format!("local reply {} refused by host (status {s})", reply.status),
                        );
                        next = Next::Continue;
                    } else {
                        next = Next::Pause;
                    }
                }
                Effect::SetRequestHeader(k, v) => {
                    refused(abi::set_header(Map::RequestHeaders, &k, &v));
                }
                Effect::RemoveRequestHeader(k) => {
                    refused(abi::remove_header(Map::RequestHeaders, &k));
                }
                Effect::SetResponseHeader(k, v) => {
                    refused(v.with_str(|v| abi::set_header(Map::ResponseHeaders, &k, v)));
                }
                Effect::RemoveResponseHeader(k) => {
                    refused(abi::remove_header(Map::ResponseHeaders, &k));
                }
                Effect::ReplaceRequestBody(b) => {
                    if refused(abi::set_buffer(
                        Buffer::RequestBody,
                        0,
                        self.request_body_len,
                        &b,
                    )) {
                        self.request_body_len = b.len();
                    }
                }
                Effect::ReplaceResponseChunk(b) => {
                    refused(abi::set_buffer(Buffer::ResponseBody, 0, self.chunk_len, &b));
                }
                Effect::AppendResponseBody(b) => {
                    // A start at or past the buffer's end appends.
                    refused(abi::set_buffer(
                        Buffer::ResponseBody,
                        u32::MAX as usize,
                        0,
                        &b,
                    ));
                }
                Effect::Dispatch(c) => {
                    if let Err(s) = dispatch(&c) {
                        // Answered at once; its effects are applied after these.
                        let reply = CalloutReply::refused(s);
                        let more = VM.with(|vm| {
                            let mut vm = vm.borrow_mut();
                            let vm = &mut *vm;
                            let mut cx = Cx {
                                cfg,
                                host: &EnvoyHost::new(),
                                worker: &mut vm.worker,
                                fx: &mut vm.fx,
                            };
                            self.req.on_callout_reply(&mut cx, reply);
                            std::mem::take(&mut vm.fx)
                        });
                        fx.extend(more);
                    }
                }
                Effect::Resume => match from {
                    From::Stream => next = Next::Continue,
                    From::Callout => {
                        if abi::resume_request().is_err() {
                            abi::log(Level::Warn, "cannot resume the request");
                        }
                    }
                },
                Effect::ResumeContext(_) => {}
                Effect::Count(..) | Effect::Gauge(..) | Effect::Log(..) | Effect::Audit(_) => {}
            }
        }
        fx.clear();
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

/// True when the host took a write; counts and logs (rate-limited by the flow's gate) a refusal.
fn refused(r: Result<(), u32>) -> bool {
    match r {
        Ok(()) => true,
        Err(s) => {
            super::metrics::add(crate::flow::Metric::HostRefused, 1);
            abi::log(
                Level::Debug,
                &format!("host refused a header or body write (status {s})"),
            );
            false
        }
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        if self.req.is_held() {
            VM.with(|vm| {
                if let Ok(mut vm) = vm.try_borrow_mut() {
                    vm.worker.forget(self.req.id());
                }
            });
        }
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
        self.request_body_len = body_size;
        self.run(From::Stream, |req, cx| {
            req.on_request_body(cx, body_size, end_of_stream)
        })
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if !self.req.sees_response() {
            return Action::Continue;
        }
        // Every response header this request looks at, in one host call, if it looks at any.
        let headers = LazyHeaders::new(Map::ResponseHeaders);
        self.run(From::Stream, |req, cx| {
            req.on_response_headers(cx, &headers, end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.req.wants_response_body(end_of_stream) {
            return Action::Continue;
        }
        self.chunk_len = body_size;
        self.run(From::Stream, |req, cx| {
            req.on_response_body(cx, body_size, end_of_stream)
        })
    }

    fn on_log(&mut self) {
        if !self.req.has_end_work() {
            return;
        }
        self.run(From::Callout, |req, cx| {
            req.on_log(cx);
            Next::Continue
        });
    }
}
