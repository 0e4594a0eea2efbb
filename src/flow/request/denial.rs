//! Every refusal the filter makes, as data: a [`Denial`] says why ([`Reason`]) and what the client is
//! told ([`Refusal`], rendered per API family by [`crate::reply::render`]); one table ([`Reason::row`])
//! gives each reason its counter, its audit decision and Envoy's response code details. The pipeline
//! turns a denial into the answer ([`super::pipeline`]); steps only say why.

use super::reservation::QuotaReq;
use crate::flow::metric::Metric;
use crate::reply::{Class, Refusal};

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::flow) enum Reason {
    /// A write on a path tokengate does not meter.
    PathNotMetered,
    /// A tenant header naming a key-derived tenant.
    ForbiddenTenant,
    /// Two different API keys.
    TwoApiKeys,
    /// An API key `api_keys` does not list.
    UnknownApiKey,
    /// No tenant.
    NoTenant,
    /// A listed API key of another tenant than the verified identity's.
    IdentityConflict,
    /// A claim of the verified token that should be an id is not.
    InvalidClaim,
    /// The body names no model and no default is configured.
    ModelRequired,
    /// An Azure deployment not listed, or a path model that cannot be read.
    UnknownDeployment,
    /// A body over `max_body_bytes`.
    TooLarge,
    /// A body that is not a request to its API.
    InvalidBody,
    /// A Responses `background: true` under `background_responses: "refuse"`.
    BackgroundNotMetered,
    /// An output limit above the model's cap (or a thinking budget that cannot fit below it).
    OutputAboveCap,
    /// A lowered output limit that no longer fits the `content-length` the upstream was promised.
    OutputDoesNotFit,
    /// A breaker is open and no fallback is usable.
    CircuitOpen,
    /// A bucket lacks tokens.
    LimitedTokens,
    /// A bucket lacks requests.
    LimitedRequests,
    /// Every in-flight slot of a limit is held.
    LimitedInFlight,
    /// The cost is above a bucket's burst.
    CostExceedsBurst,
    /// A bucket could not record the request (`on_store_error: deny`).
    StoreError,
    /// Redis could not charge a global bucket (`global_buckets.on_failure: closed`).
    GlobalUnavailable,
    /// A tenant known (in shared data) to have spent its month.
    QuotaExceededCached,
    /// A budget's account known to be spent.
    BudgetExceededCached,
    /// Redis refused a quota reservation.
    QuotaExceeded,
    /// Redis refused a budget reservation.
    BudgetExceeded,
    /// Redis refused a quota reservation that other Envoys' leases would cover (retryable).
    QuotaHeldElsewhere,
    /// The quota shim could not answer (`on_failure: closed`).
    QuotaUnavailable,
    /// A quota's clamp leaves no room for Anthropic's minimum thinking budget.
    ThinkingDoesNotFit,
}

/// One row of the table: what a refusal for a reason counts, writes and reports.
pub(in crate::flow) struct Row {
    /// The counter it bumps (none: a refusal another counter already explains).
    pub metric: Option<Metric>,
    /// The audit record's `decision`.
    pub decision: &'static str,
    /// Envoy's response code details of the local reply.
    pub details: &'static str,
    /// The audit record and `x-tokengate-estimated-tokens` report the request's estimated cost
    /// (refusals made once the estimate was charged somewhere).
    pub reports_cost: bool,
}

impl Reason {
    /// The table.
    pub fn row(self) -> Row {
        use Metric as M;
        let (metric, decision, details, reports_cost) = match self {
            Reason::PathNotMetered => (
                Some(M::RequestsRejectedUnmetered),
                "path_not_metered",
                "tokengate_path_not_metered",
                false,
            ),
            Reason::ForbiddenTenant => (
                Some(M::RequestsRejectedNoTenant),
                "forbidden_tenant",
                "tokengate_forbidden_tenant",
                false,
            ),
            Reason::TwoApiKeys => (
                Some(M::RequestsRejectedNoTenant),
                "two_api_keys",
                "tokengate_two_api_keys",
                false,
            ),
            Reason::UnknownApiKey => (
                Some(M::RequestsRejectedNoTenant),
                "unknown_api_key",
                "tokengate_unknown_api_key",
                false,
            ),
            Reason::NoTenant => (
                Some(M::RequestsRejectedNoTenant),
                "no_tenant",
                "tokengate_no_tenant",
                false,
            ),
            Reason::IdentityConflict => (
                Some(M::RequestsRejectedNoTenant),
                "identity_conflict",
                "tokengate_identity_conflict",
                false,
            ),
            Reason::InvalidClaim => (
                Some(M::RequestsRejectedNoTenant),
                "invalid_claim",
                "tokengate_invalid_claim",
                false,
            ),
            Reason::ModelRequired => (
                Some(M::RequestsRejectedInvalidBody),
                "model_required",
                "tokengate_model_required",
                false,
            ),
            Reason::UnknownDeployment => (
                Some(M::RequestsRejectedInvalidBody),
                "unknown_deployment",
                "tokengate_unknown_deployment",
                false,
            ),
            Reason::TooLarge => (
                Some(M::RequestsRejectedTooLarge),
                "too_large",
                "tokengate_too_large",
                false,
            ),
            Reason::InvalidBody => (
                Some(M::RequestsRejectedInvalidBody),
                "invalid_body",
                "tokengate_invalid_body",
                false,
            ),
            Reason::BackgroundNotMetered => (
                Some(M::RequestsRejectedUnmetered),
                "background_not_metered",
                "tokengate_background_not_metered",
                false,
            ),
            Reason::OutputAboveCap => (
                Some(M::RequestsRejectedInvalidBody),
                "output_above_cap",
                "tokengate_output_above_cap",
                false,
            ),
            Reason::OutputDoesNotFit => (
                None,
                "output_above_cap",
                "tokengate_output_above_cap",
                false,
            ),
            Reason::CircuitOpen => (
                Some(M::BreakerShortCircuited),
                "circuit_open",
                "tokengate_circuit_open",
                false,
            ),
            Reason::LimitedTokens => (
                Some(M::RequestsLimitedTokens),
                "limited_tokens",
                "tokengate_rejected",
                true,
            ),
            Reason::LimitedRequests => (
                Some(M::RequestsLimitedRequests),
                "limited_requests",
                "tokengate_rejected",
                true,
            ),
            Reason::LimitedInFlight => (
                Some(M::RequestsLimitedInFlight),
                "limited_in_flight",
                "tokengate_rejected",
                true,
            ),
            Reason::CostExceedsBurst => (
                Some(M::RequestsRejectedCostExceedsBurst),
                "cost_exceeds_burst",
                "tokengate_rejected",
                true,
            ),
            Reason::StoreError => (None, "deny_store_error", "tokengate_store_error", true),
            Reason::GlobalUnavailable => (
                Some(M::GlobalFailClosed),
                "global_unavailable",
                "tokengate_global_unavailable",
                true,
            ),
            Reason::QuotaExceededCached => (
                Some(M::QuotaRejectedCached),
                "quota_exceeded_cached",
                "tokengate_quota_exceeded",
                false,
            ),
            Reason::BudgetExceededCached => (
                Some(M::QuotaRejectedCached),
                "budget_exceeded_cached",
                "tokengate_quota_exceeded",
                true,
            ),
            Reason::QuotaExceeded => (
                Some(M::QuotaRejected),
                "quota_exceeded",
                "tokengate_quota_exceeded",
                true,
            ),
            Reason::BudgetExceeded => (
                Some(M::QuotaRejected),
                "budget_exceeded",
                "tokengate_quota_exceeded",
                true,
            ),
            Reason::QuotaHeldElsewhere => (
                Some(M::QuotaRejected),
                "quota_held_elsewhere",
                "tokengate_quota_held_elsewhere",
                true,
            ),
            Reason::QuotaUnavailable => (
                Some(M::QuotaFailClosed),
                "quota_unavailable",
                "tokengate_quota_unavailable",
                true,
            ),
            Reason::ThinkingDoesNotFit => (
                None,
                "thinking_does_not_fit",
                "tokengate_thinking_does_not_fit",
                true,
            ),
        };
        Row {
            metric,
            decision,
            details,
            reports_cost,
        }
    }

    /// The reason of a bucket's refusal (429 or 413), by its class.
    pub fn of_bucket(refusal: &Refusal) -> Reason {
        match refusal.class {
            Class::TokensPerSecond => Reason::LimitedTokens,
            Class::RequestsPerMinute => Reason::LimitedRequests,
            Class::ConcurrencyLimit => Reason::LimitedInFlight,
            _ => Reason::CostExceedsBurst,
        }
    }
}

/// A refusal: why, what the client is told, and what is left to settle.
pub(in crate::flow) struct Denial {
    /// Why.
    pub reason: Reason,
    /// The answer.
    pub refusal: Refusal,
    /// The audit record's `model` when it is not the request's (an open breaker's name; the model
    /// named in `model_header` for a headers-phase refusal).
    pub model: Option<String>,
    /// A reservation whose outcome is unknown (its callout timed out): reconciled once the answer is
    /// sent.
    pub reconcile: Option<Box<QuotaReq>>,
}

impl Denial {
    /// A refusal for `reason` (boxed: refusals are rare, and a step's result stays small).
    pub fn new(reason: Reason, refusal: Refusal) -> Box<Self> {
        Box::new(Denial {
            reason,
            refusal,
            model: None,
            reconcile: None,
        })
    }

    /// A bucket's refusal, its reason from its class.
    pub fn bucket(refusal: Refusal) -> Box<Self> {
        Denial::new(Reason::of_bucket(&refusal), refusal)
    }

    /// The audit record names `model` instead of the request's.
    pub fn naming(mut self: Box<Self>, model: impl Into<String>) -> Box<Self> {
        self.model = Some(model.into());
        self
    }
}
