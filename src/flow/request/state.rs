//! The per-request state: one type per stage, carried forward as the request moves on.
//!
//! ```text
//! New ──headers──> Passthrough                        (not an LLM call)
//!   └────────────> AwaitingBody(Meta) ──body──> Admitting(Plan) ──callout reply──> …
//!                        │                         │
//!                        └──────── Replied <───────┴──> Held(Forwarded) ──tick──> Forwarded
//!                                                   └──> Forwarded ──response, end──> (settled)
//! ```
//!
//! A reservation of a quota or budget has its own lifecycle ([`Hold`], in `reservation.rs`).

pub(in crate::flow) use super::reservation::{Hold, QuotaReq, Sent};
use crate::breaker::failover::Held;
use crate::breaker::View;
use crate::estimate::ApiKind;
pub(in crate::flow) use crate::flow::vm::state::FairMember;
use crate::limits::bucket::Snapshot;
use crate::store::Seen;
use crate::usage::StreamScanner;

/// One request's context.
pub struct Request {
    /// Envoy's context id.
    pub(in crate::flow) id: u32,
    /// Which API family's shapes the answers take.
    pub(in crate::flow) family: crate::reply::Family,
    /// The request id echoed in the filter's own answers (`x-request-id`, or one made up).
    pub(in crate::flow) reply_id: String,
    pub(in crate::flow) stage: Stage,
}

impl Request {
    /// A new request with Envoy's context id.
    pub fn new(id: u32) -> Self {
        Request {
            id,
            family: crate::reply::Family::OpenAi,
            reply_id: String::new(),
            stage: Stage::New,
        }
    }

    /// Envoy's context id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// True when shaping held the request (the adapter drops it from the hold list on drop). A held
    /// request is resumed by the root's tick without its context knowing: it stays `Held` and is
    /// treated as forwarded from then on.
    pub fn is_held(&self) -> bool {
        matches!(self.stage, Stage::Held(_))
    }

    /// True once the request was admitted (the response phases have work to do), or while its
    /// admission is pending (an upstream that answers before the body was read is a defined case).
    pub fn sees_response(&self) -> bool {
        matches!(
            self.stage,
            Stage::Forwarded(_) | Stage::Held(_) | Stage::Admitting(_)
        )
    }

    /// True when a response chunk must be shown to the flow (a stream or JSON body being read, or the
    /// end of the response with something to settle, refund or record).
    pub fn wants_response_body(&self, end_of_stream: bool) -> bool {
        match &self.stage {
            Stage::Forwarded(f) | Stage::Held(f) => {
                f.resp.stream.is_some()
                    || f.resp.collect
                    || (end_of_stream
                        && (!f.quotas.is_empty() || f.refund || !f.charges.breakers.is_empty()))
            }
            _ => false,
        }
    }

    /// True when `on_log` has work to do (a breaker outcome, a settlement or refund not done yet, a
    /// reconciliation to queue).
    pub fn has_end_work(&self) -> bool {
        match &self.stage {
            Stage::Forwarded(f) | Stage::Held(f) => {
                !f.charges.breakers.is_empty()
                    || !f.charges.slots.is_empty()
                    || f.quotas.iter().any(|q| !q.settled())
                    || (f.refund && !f.resp.refunded)
            }
            Stage::Replied(r) => r.reconcile.is_some(),
            // The client went while the admission waited on a callout: give back what it took.
            Stage::Admitting(_) => true,
            _ => false,
        }
    }

    /// True while the request waits for an answer the root context brings and continues it with
    /// (its reservation in this VM's batch, `flow::vm::batch`): the host adapter keeps the request
    /// where the root can reach it.
    pub fn waits_on_root(&self) -> bool {
        match &self.stage {
            Stage::Admitting(plan) => matches!(
                &plan.inflight,
                InFlight::Quota(q) if matches!(q.hold, Hold::Sent(Sent { batched: true, .. }))
            ),
            _ => false,
        }
    }

    /// The stage, for tests and logs.
    pub fn phase(&self) -> &'static str {
        match &self.stage {
            Stage::New => "new",
            Stage::Passthrough => "passthrough",
            Stage::AwaitingBody(_) => "awaiting_body",
            Stage::Admitting(_) => "admitting",
            Stage::Held(_) => "held",
            Stage::Forwarded(_) => "forwarded",
            Stage::Replied(_) => "replied",
            Stage::Done => "done",
        }
    }
}

/// Where a request is.
pub(in crate::flow) enum Stage {
    /// Nothing seen yet.
    New,
    /// Not metered: forwarded untouched.
    Passthrough,
    /// Metered; waiting for the end of the body.
    AwaitingBody(Box<Meta>),
    /// The body was read; an admission step waits for its callout (`Plan::at`).
    Admitting(Box<Plan>),
    /// Admitted, held by shaping until the root's tick releases it.
    Held(Box<Forwarded>),
    /// Admitted and sent upstream.
    Forwarded(Box<Forwarded>),
    /// The filter answered itself; an uncertain reservation may still need reconciling at the end.
    Replied(Box<Replied>),
    /// Settled; nothing left to do.
    Done,
}

/// What the headers phase learnt about the cluster breaker.
#[derive(Debug, Clone)]
pub(in crate::flow) enum ClusterSeen {
    /// The set of open breakers names no cluster: CLOSED, named at the end if needed.
    Closed,
    /// Its key was read: the cluster chosen (after any fallback), and when it was read CLOSED.
    Named {
        name: String,
        closed_at: Option<u64>,
    },
}

/// What the headers phase learnt.
#[derive(Debug, Clone, Default)]
pub(in crate::flow) struct Meta {
    pub kind: Option<ApiKind>,
    pub tenant: String,
    /// The model named in `model_header`: a hint for the headers phase only (the body decides).
    pub model_hint: Option<String>,
    /// The model the path names (an Azure deployment's model, a Gemini, Vertex AI or Bedrock model
    /// id): it decides over the body's.
    pub path_model: Option<String>,
    /// An Azure OpenAI `v1` path (`/openai/v1/…`, `/openai/responses`): the body's model is a
    /// deployment name, mapped by `azure_openai.deployments`.
    pub azure_v1: bool,
    /// The client's `x-request-id` (its first 64 bytes): a reservation names its settlement
    /// `<this>-<context>-<ns>` ([`crate::flow::request::headers::settlement_id`]).
    pub request_id: String,
    /// The cluster breaker as the headers phase saw it (`None`: no cluster breaker).
    pub cluster: Option<ClusterSeen>,
    /// The set of open breakers as the headers phase read it, and when: the model breaker's check
    /// reuses it while it is fresh ([`crate::flow::vm::breakers::OPEN_SET_REUSE_MS`]).
    pub open_set: Option<(View, u64)>,
    /// `x-tokengate-fallback` hops.
    pub fallbacks: Vec<String>,
    /// The `content-length` the upstream was promised (kept): a rewritten body must have this length.
    pub fixed_length: Option<usize>,
    /// The bucket read in the headers phase (key, value, CAS token): the body-phase charge of that same
    /// key starts from it (its CAS catches any write in between).
    pub prechecked: Option<(String, Seen)>,
    /// The request's group at each level of `groups` (outermost first).
    pub groups: Vec<Option<String>>,
    /// A Responses `background: true` admitted under `background_responses: "reservation"` (learnt
    /// from the body): it is charged its whole reservation unless it completes with usage.
    pub background: bool,
}

/// One bucket charge, kept to give it back if a later step refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::flow) struct Charge {
    pub rule: usize,
    pub key: String,
    pub cost: u64,
}

/// One fair limit's charge (`share: "fair"`): its bucket record (in this Envoy's shared data, or in
/// Redis for a `global` one) and the member charged, to give it back if a later step refuses.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::flow) struct FairCharge {
    pub rule: usize,
    pub key: String,
    /// The member, as the record knows it.
    pub member: FairMember,
    pub cost: u64,
    /// The record is in Redis (a `global` fair limit).
    pub global: bool,
}

/// What the request was charged so far.
#[derive(Debug, Clone, Default)]
pub(in crate::flow) struct Charges {
    /// Buckets in this Envoy's shared data (its rule's, then every matching limit's).
    pub local: Vec<Charge>,
    /// Fair limits' records.
    pub fair: Vec<FairCharge>,
    /// Global (Redis) buckets.
    pub global: Vec<Charge>,
    /// In-flight slots held: (semaphore key, owner).
    pub slots: Vec<(String, u64)>,
    /// Breakers that admitted it.
    pub breakers: Vec<Held>,
}

/// The request once its body was read: the estimate, the model, the charges, and where its admission
/// is.
pub(in crate::flow) struct Plan {
    /// Envoy's context id of the request (it owns the request's in-flight slots).
    pub context: u32,
    pub meta: Meta,
    pub model: String,
    /// The model breaker was read CLOSED for this model (the breakers step takes its admission without
    /// reading it again).
    pub model_closed: Option<String>,
    /// Estimated tokens (prompt + reserved output), what buckets are charged.
    pub cost: u64,
    pub prompt: u64,
    pub output: u64,
    /// Choices the reserved output covers (a quota clamp divides by it).
    pub choices: u64,
    /// The body as sent upstream (kept while a quota reservation may clamp it).
    pub body: Vec<u8>,
    /// `stream_options.include_usage` was added: strip the extra chunk.
    pub injected_usage: bool,
    pub charges: Charges,
    /// The bucket state after the charge, for `x-ratelimit-*`.
    pub snapshot: Option<Snapshot>,
    /// Shaping: hold this long once every step admitted.
    pub wait_ms: u64,
    /// The admission step running or waiting for its callout (an index in the pipeline's list).
    pub at: usize,
    /// The callout in flight, if any.
    pub inflight: InFlight,
    /// Global bucket charges still to make after the one in flight (rule index, key), last first.
    pub globals: Vec<(usize, String)>,
    /// Fair limits still to charge after the one in flight (rule index), last first.
    pub fairs: Vec<usize>,
    /// Quota reservations made (the tenant's token quota, then its budgets).
    pub quotas: Vec<QuotaReq>,
    /// Quota reservations still to make after the one in flight, last first.
    pub pending_quotas: Vec<QuotaReq>,
    /// Models this request was sent to instead after a refusal (`when_exhausted`), as
    /// `from -> to` hops.
    pub downgraded: Vec<String>,
    /// The refusal that sent it to another model, and its cost then: the answer if the other model
    /// refuses too.
    pub first_denial: Option<(Box<super::denial::Denial>, u64)>,
}

/// The callout an admission step waits for.
pub(in crate::flow) enum InFlight {
    /// None.
    Nothing,
    /// A global bucket charge.
    Global(GlobalCharge),
    /// A global fair limit's charge (the charge, sent as `EVAL` or not).
    Fair(FairCharge, Sent),
    /// A quota reservation (or the give-back of this Envoy's lease before it is sent again).
    Quota(Box<QuotaReq>),
}

/// One request's global bucket charge.
pub(in crate::flow) struct GlobalCharge {
    pub rule: usize,
    pub key: String,
    pub cost: u64,
    /// How its callout was sent.
    pub sent: Sent,
    /// The lease block (tokens, requests) asked with this charge (`global_buckets.lease`).
    pub block: Option<(u64, u64)>,
    /// Tokens of the charge taken from this Envoy's lease (what it held, short of the cost): Redis is
    /// charged the rest; given back to the lease if the request is not admitted.
    pub from_lease: u64,
}

/// What the response said, for the breaker, the quota settlement and `refund_unused`.
#[derive(Default)]
pub(in crate::flow) struct Resp {
    /// HTTP status (0 = no response headers seen).
    pub status: u32,
    /// `retry-after` of a failure.
    pub retry_after: Option<String>,
    /// Reset hints of a failure (`x-ratelimit-reset-*`, `retry-after-ms` as `<n>ms`).
    pub reset_headers: Vec<String>,
    /// A streamed answer, scanned as it passes (its family's framing: SSE, Gemini's SSE or JSON
    /// array, Bedrock's AWS event stream): its end, usage and content size.
    pub stream: Option<StreamScanner>,
    /// Keep a JSON response body to read its `usage`.
    pub collect: bool,
    /// Bedrock `invoke`'s token counts from its response headers (`x-amzn-bedrock-input-token-count`,
    /// `x-amzn-bedrock-output-token-count`), as sent.
    pub token_headers: Option<Box<(String, String)>>,
    /// The kept JSON body (bounded by `MAX_JSON_RESPONSE`).
    pub json: Vec<u8>,
    /// Unused bucket tokens were already given back.
    pub refunded: bool,
    /// The response reached its end of stream.
    pub ended: bool,
}

/// An admitted request.
pub(in crate::flow) struct Forwarded {
    pub meta: Meta,
    pub model: String,
    pub cost: u64,
    pub injected_usage: bool,
    pub charges: Charges,
    pub snapshot: Option<Snapshot>,
    pub shaped_ms: u64,
    /// A charged rule gives back unused tokens (`refund_unused`).
    pub refund: bool,
    /// Reservations: the token quota, then budgets.
    pub quotas: Vec<QuotaReq>,
    /// The decision written to the audit record (kept when settlement facts are added).
    pub decision: &'static str,
    /// `from -> to` hops of a downgrade (`when_exhausted`).
    pub downgraded: Vec<String>,
    pub resp: Resp,
}

impl Forwarded {
    /// The tenant's token quota reservation (headers, audit), if any.
    pub fn token_quota(&self) -> Option<&QuotaReq> {
        self.quotas.iter().find(|q| q.budget.is_none())
    }

    /// The response must be looked at (breaker outcome, settlement, refund).
    pub fn settling(&self) -> bool {
        self.quotas.iter().any(|q| q.answered() || q.uncertain())
    }
}

/// A request the filter answered itself.
pub(in crate::flow) struct Replied {
    pub audit: Audit,
    /// A reservation whose outcome is unknown (the callout timed out): reconciled at the end.
    pub reconcile: Option<Box<QuotaReq>>,
}

/// What the audit record says.
#[derive(Debug, Clone, Default)]
pub(in crate::flow) struct Audit {
    pub tenant: String,
    pub model: String,
    pub cost: Option<u64>,
    pub decision: &'static str,
}
