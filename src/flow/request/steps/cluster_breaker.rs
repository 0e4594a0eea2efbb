//! Headers step: the breaker of the upstream cluster (`breaker.keys.cluster`). While the set of open
//! breakers names no cluster this is one shared-data read; otherwise the cluster's breaker and its
//! fallbacks are read the exact way ([`crate::breaker::failover::peek_chain`]): an open one is skipped
//! for its fallback (a route header, which makes Envoy pick the fallback's route), and when every
//! one is open the request is refused (503, Anthropic 529). The admission itself is taken after the
//! buckets admitted (the breakers step).

use crate::breaker::failover;
use crate::flow::cx::Cx;
use crate::flow::effect::{Effect, Headers};
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::{ClusterSeen, Meta};
use crate::flow::vm::breakers;
use std::borrow::Cow;

/// Checks the cluster breaker; notes in `meta` what was seen.
pub(in crate::flow) fn check(
    cx: &mut Cx,
    _h: &dyn Headers,
    meta: &mut Meta,
) -> Result<(), Box<Denial>> {
    let Some(b) = cx.cfg.breaker.as_ref().filter(|b| b.keys.cluster) else {
        return Ok(());
    };
    let v = breakers::view(cx);
    // Stamped with a recent time (no clock read here): never younger than the read.
    meta.open_set = Some((v.clone(), cx.host.recent_ns()));
    if !v.may_have_scope("cluster") {
        meta.cluster = Some(ClusterSeen::Closed);
        return Ok(());
    }
    let Some(cluster) = breakers::cluster_name(cx) else {
        return Ok(());
    };
    let next = |c: &str| {
        b.cluster_fallback(c)
            .map(|f| (f.to.clone(), Some(f.route.clone())))
    };
    let (now, retries) = (cx.now(), cx.cfg.cas_max_retries);
    match failover::peek_chain(cx.store(), b, &v, "cluster", &cluster, &next, now, retries) {
        Ok(choice) => {
            if let (Some(from), Some(route)) = (&choice.from, &choice.route) {
                // Envoy re-picks the route when a header changes in this phase.
                cx.fx.push(Effect::SetRequestHeader(
                    Cow::Owned(b.route_header.clone()),
                    route.clone(),
                ));
                cx.inc(Metric::BreakerFallbacks);
                meta.fallbacks.push(format!("{from} -> {}", choice.target));
            }
            meta.cluster = Some(ClusterSeen::Named {
                closed_at: choice.closed.then_some(now),
                name: choice.target,
            });
            Ok(())
        }
        Err(reset) => Err(Denial::new(
            Reason::CircuitOpen,
            answers::circuit_open("cluster", &cluster, reset),
        )
        .naming(cluster)),
    }
}
