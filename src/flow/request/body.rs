//! Phase 2, request body: buffered to its end (413 past `max_body_bytes`), then read and admitted by
//! the pipeline ([`super::pipeline::READ`], [`super::pipeline::ADMIT`]).

use super::state::{Request, Stage};
use super::steps::body_size;
use crate::flow::cx::Cx;
use crate::flow::effect::{Body, Level, Next};

impl Request {
    /// Envoy's request-body callback.
    pub fn on_request_body(&mut self, cx: &mut Cx, body_size: usize, end_of_stream: bool) -> Next {
        let Stage::AwaitingBody(meta) = &self.stage else {
            return Next::Continue;
        };
        if let Err(d) = body_size::received(cx, body_size) {
            let meta = (**meta).clone();
            return self.deny(cx, &meta, "", None, d);
        }
        if !end_of_stream {
            return Next::Pause;
        }
        match cx.host.body(Body::Request, body_size) {
            Some(body) => self.on_body(cx, &body),
            None => {
                cx.log_failure(
                    Level::Warn,
                    "read_body",
                    "cannot read the request body; estimating it as empty".to_string(),
                );
                self.on_body(cx, &[])
            }
        }
    }

    /// The body is complete (or there is none): read and admitted.
    pub(super) fn on_body(&mut self, cx: &mut Cx, body: &[u8]) -> Next {
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::AwaitingBody(meta) => self.admit_body(cx, *meta, body),
            other => {
                self.stage = other;
                Next::Continue
            }
        }
    }
}
