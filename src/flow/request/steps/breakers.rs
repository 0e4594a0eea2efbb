//! Admission step: the admissions of the cluster and model breakers, taken once the buckets admitted
//! (a request refused by a bucket never holds a half-open probe permit). A breaker the headers phase or
//! the model step read CLOSED needs no shared data here; one that was not read is admitted the exact way
//! ([`crate::breaker::failover::admit`]) and may refuse (503) when it lost its last permit to another
//! worker. The outcome is written when the request ends (`end.rs`).

use crate::breaker::failover::{self, Held};
use crate::config::BreakerSettings;
use crate::flow::cx::Cx;
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::{Charges, ClusterSeen, Meta, Plan};
use crate::flow::request::step::{Outcome, Step};
use crate::flow::vm::breakers;
use crate::flow::vm::state::KNOWN_KEYS_CACHE;

/// How long a cluster breaker read CLOSED in the headers phase counts as seen closed when the body
/// phase takes the admission (long uploads read it again).
const CLUSTER_SEEN_CLOSED_NS: u64 = 1_000_000_000;

/// The step.
pub(in crate::flow) struct Breakers;

impl Step for Breakers {
    fn start(&self, cx: &mut Cx, plan: &mut Plan) -> Outcome {
        let cfg = cx.cfg;
        let Some(b) = &cfg.breaker else {
            return Outcome::Continue;
        };
        let now = cx.now();
        for (scope, name, seen_closed) in targets(
            b,
            &plan.meta,
            &plan.model,
            plan.model_closed.as_deref(),
            now,
        )
        .into_iter()
        .flatten()
        {
            match admit(cx, b, scope, name.as_deref(), seen_closed, now) {
                Ok(Some(held)) => plan.charges.breakers.push(held),
                Ok(None) => {}
                Err(reset) => {
                    let name = name.unwrap_or_default();
                    let refusal = answers::circuit_open(scope, &name, reset);
                    return Outcome::Deny(Denial::new(Reason::CircuitOpen, refusal).naming(name));
                }
            }
        }
        Outcome::Continue
    }

    fn undo(&self, cx: &mut Cx, plan: &mut Plan) {
        release(cx, &mut plan.charges);
    }
}

/// Gives back the probe permits of a request that was not sent after all.
pub(in crate::flow) fn release(cx: &mut Cx, charges: &mut Charges) {
    let retries = cx.cfg.cas_max_retries;
    for h in std::mem::take(&mut charges.breakers) {
        failover::release(cx.store(), &h, retries);
    }
}

/// One admission to take: `(scope, name, seen closed)`; a breaker seen closed needs no shared data.
type Target = (&'static str, Option<String>, bool);

/// The admissions to take, in order: the cluster, then the model (`model_closed`: the model breaker
/// peeked CLOSED).
fn targets(
    b: &BreakerSettings,
    meta: &Meta,
    model: &str,
    model_closed: Option<&str>,
    now: u64,
) -> [Option<Target>; 2] {
    let cluster = match &meta.cluster {
        Some(ClusterSeen::Closed) => Some(("cluster", None, true)),
        Some(ClusterSeen::Named { name, closed_at }) => {
            let closed = closed_at.is_some_and(|t| now.saturating_sub(t) < CLUSTER_SEEN_CLOSED_NS);
            Some(("cluster", Some(name.clone()), closed))
        }
        None => None,
    };
    let model = (b.keys.model && !model.is_empty()).then(|| {
        let closed = model_closed == Some(model);
        // A model seen closed is named at the end by the request's model.
        ("model", (!closed).then(|| model.to_string()), closed)
    });
    [cluster, model]
}

/// Takes the admission on one target: `Ok(Some(held))`, `Ok(None)` (untracked), or `Err(reset_in_ms)`.
fn admit(
    cx: &mut Cx,
    b: &BreakerSettings,
    scope: &'static str,
    name: Option<&str>,
    seen_closed: bool,
    now: u64,
) -> Result<Option<Held>, u64> {
    let name = match (seen_closed, name) {
        (true, None) => return Ok(Some(Held::closed(scope))),
        (true, Some(n)) => {
            return Ok(Some(Held {
                scope,
                name: Some(n.to_string()),
                probe: false,
            }))
        }
        (false, Some(n)) => n,
        (false, None) => return Ok(None),
    };
    let (res, t) = failover::admit(
        cx.host.store(),
        b,
        scope,
        name,
        now,
        cx.cfg.cas_max_retries,
        &mut cx.worker.known_keys,
        KNOWN_KEYS_CACHE,
    );
    if let Some(t) = t {
        breakers::transition(cx, &crate::breaker::key(scope, name), t);
    }
    if let Ok(Some(h)) = &res {
        if h.probe {
            cx.inc(Metric::BreakerProbes);
        }
    }
    res
}
