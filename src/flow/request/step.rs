//! What a step of the pipeline is ([`super::pipeline`] lists them in order; each lives in its own file
//! under `steps/`).
//!
//! * A **headers step** ([`HeaderStep`]) decides from the request headers alone; a refusal there means
//!   the upstream is never contacted.
//! * A **reading step** ([`ReadStep`]) works on the body once it is whole: what the request is, which
//!   model it goes to, what is sent upstream ([`Draft`]).
//! * An **admission step** ([`Step`]) charges something, all or nothing: it admits ([`Outcome::Continue`]),
//!   waits for its own callout and handles the answer ([`Outcome::Await`], [`Step::on_reply`]), or
//!   refuses ([`Outcome::Deny`]); when a later step refuses, every step that ran gives back what it took
//!   ([`Step::undo`]).

use super::denial::Denial;
use super::state::{Meta, Plan};
use crate::estimate::{ApiKind, Estimate};
use crate::flow::cx::Cx;
use crate::flow::effect::{Callout, CalloutReply, Headers};
use crate::rewrite::Edits;

/// A step of the headers phase.
pub(in crate::flow) type HeaderStep =
    fn(&mut Cx, &dyn Headers, &mut Meta) -> Result<(), Box<Denial>>;

/// A step of reading the body.
pub(in crate::flow) type ReadStep = for<'a> fn(&mut Cx, &mut Draft<'a>) -> Result<(), Box<Denial>>;

/// The request while its body is read: what the reading steps learn and decide, before anything is
/// charged.
pub(in crate::flow) struct Draft<'a> {
    pub meta: Meta,
    pub kind: ApiKind,
    /// The body as the client sent it.
    pub body: &'a [u8],
    /// The estimate (`None`: the body could not be read and `invalid_body` charges a fixed cost).
    pub est: Option<Estimate>,
    pub prompt: u64,
    pub output: u64,
    pub cost: u64,
    pub choices: u64,
    /// The model the request is charged as (after a breaker's fallback).
    pub model: String,
    /// The model breaker was read CLOSED for this model.
    pub model_closed: Option<String>,
    /// The edits of the body.
    pub edits: Edits,
    /// `x-tokengate-fallback` hops added here.
    pub fallbacks: Vec<String>,
    /// The body as sent upstream, kept when a quota may clamp it.
    pub kept: Vec<u8>,
    /// `stream_options.include_usage` was added.
    pub injected_usage: bool,
}

/// What an admission step says.
pub(in crate::flow) enum Outcome {
    /// Admitted: the next step runs.
    Continue,
    /// Waiting for this callout; its answer goes to [`Step::on_reply`].
    Await(Callout),
    /// Refused.
    Deny(Box<Denial>),
    /// Waiting for an answer that the root context brings (a reservation in this VM's batch,
    /// `flow::vm::batch`): the request pauses; its step's [`Step::on_reply`] runs when it comes.
    Park,
}

/// An admission step.
pub(in crate::flow) trait Step: Sync {
    /// Runs the step on `plan`.
    fn start(&self, cx: &mut Cx, plan: &mut Plan) -> Outcome;

    /// The answer to the callout this step waits for (or the host's refusal to send it).
    fn on_reply(&self, cx: &mut Cx, plan: &mut Plan, reply: CalloutReply) -> Outcome {
        let _ = (cx, plan, reply);
        Outcome::Continue
    }

    /// Gives back what this step took for `plan` (a later step refused, or the client went).
    fn undo(&self, cx: &mut Cx, plan: &mut Plan) {
        let _ = (cx, plan);
    }
}
