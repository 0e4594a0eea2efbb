//! Headers step and body check: a body over `max_body_bytes` is refused (413) — from its declared
//! `content-length` before the upstream is contacted ([`declared`]), or as it arrives when it was sent
//! chunked ([`received`]).

use crate::flow::cx::Cx;
use crate::flow::effect::Headers;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::Meta;

/// A `content-length` over `max_body_bytes`.
pub(in crate::flow) fn declared(
    cx: &mut Cx,
    h: &dyn Headers,
    _meta: &mut Meta,
) -> Result<(), Box<Denial>> {
    let max = cx.cfg.max_body_bytes;
    match h
        .get("content-length")
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        Some(len) if len > max as u64 => Err(too_large(max)),
        _ => Ok(()),
    }
}

/// `size` bytes of body have arrived.
pub(in crate::flow) fn received(cx: &Cx, size: usize) -> Result<(), Box<Denial>> {
    let max = cx.cfg.max_body_bytes;
    if size > max {
        return Err(too_large(max));
    }
    Ok(())
}

fn too_large(max: usize) -> Box<Denial> {
    Denial::new(Reason::TooLarge, answers::too_large(max))
}
