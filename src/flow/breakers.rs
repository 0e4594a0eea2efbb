//! The request breakers (cluster, model) in the flow: checked in the headers phase (cluster) and once the
//! body is read (model), taken after the bucket admitted, reported when the request ends; successes of a
//! failure-rate breaker written in batches by the VM's tick. The mechanics — one read of the set of open
//! breakers while all are closed, and the staleness bounds — are in [`crate::breaker::failover`].

use super::state::{Forwarded, Meta};
use super::worker::KNOWN_KEYS_CACHE;
use super::{Cx, Effect, Level, Metric};
use crate::breaker::failover::{self, Choice, Ctx, Held};
use crate::breaker::{self, Outcome, View};
use crate::config::BreakerSettings;
use crate::usage::SseScanner;
use std::borrow::Cow;

/// How long a cluster breaker read CLOSED in the headers phase counts as seen closed when the body
/// phase takes the admission (long uploads read it again).
const CLUSTER_SEEN_CLOSED_NS: u64 = 1_000_000_000;

/// What the headers phase learnt about the cluster breaker.
#[derive(Debug, Clone)]
pub(super) enum ClusterSeen {
    /// The set of open breakers names no cluster: CLOSED, named at the end if needed.
    Closed,
    /// Its key was read: the cluster chosen (after any fallback), and when it was read CLOSED.
    Named {
        name: String,
        closed_at: Option<u64>,
    },
}

/// Reads the set of open breakers, counting (and repairing) a corrupt one.
fn view(cx: &mut Cx) -> View {
    let v = failover::view(cx.store());
    if let View::Unknown { corrupt: true } = v {
        cx.inc(Metric::StateCorrupt);
        cx.log_failure(
            Level::Warn,
            "corrupt_breaker_set",
            format!(
                "corrupt value at {}: every breaker key is read until it is repaired",
                breaker::OPEN_SET_KEY
            ),
        );
        let _ = breaker::open_set::repair(cx.store());
    }
    v
}

/// Headers phase: the cluster breaker. `Err((cluster, reset_in_ms))` when it and every fallback are open.
pub(super) fn check_cluster(
    cx: &mut Cx,
    b: &BreakerSettings,
    meta: &mut Meta,
) -> Result<(), (String, u64)> {
    let v = view(cx);
    if !v.may_have_scope("cluster") {
        meta.cluster = Some(ClusterSeen::Closed);
        return Ok(());
    }
    let Some(cluster) = cx
        .host
        .property(&["xds", "cluster_name"])
        .and_then(|v| String::from_utf8(v).ok())
        .filter(|c| !c.is_empty())
    else {
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
        Err(reset) => Err((cluster, reset)),
    }
}

/// Body phase: the model breaker (and its fallbacks), read the exact way only when the set of open
/// breakers names it. (The set is read again rather than kept from the headers phase: keeping it would
/// need the time of that read, and asking the host for the time costs about what this read costs.)
pub(super) fn check_model(cx: &mut Cx, b: &BreakerSettings, model: &str) -> Result<Choice, u64> {
    let v = view(cx);
    if !v.may_be_open("model", model) {
        return Ok(Choice {
            target: model.to_string(),
            from: None,
            route: None,
            closed: true,
        });
    }
    let next = |m: &str| b.model_fallback(m).map(|t| (t.to_string(), None));
    let (now, retries) = (cx.now(), cx.cfg.cas_max_retries);
    failover::peek_chain(cx.store(), b, &v, "model", model, &next, now, retries)
}

/// One admission to take: `(scope, name, seen closed)`; a breaker seen closed needs no shared data.
pub(super) type Target = (&'static str, Option<String>, bool);

/// The admissions to take, in order: the cluster, then the model (`model_closed`: the model breaker
/// peeked CLOSED).
pub(super) fn targets(
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
pub(super) fn admit(
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
        super::end::transition(cx, &breaker::key(scope, name), t);
    }
    if let Ok(Some(h)) = &res {
        if h.probe {
            cx.inc(Metric::BreakerProbes);
        }
    }
    res
}

/// Gives back the probe permits of a request that was not sent after all.
pub(super) fn release(cx: &mut Cx, held: Vec<Held>) {
    let retries = cx.cfg.cas_max_retries;
    for h in &held {
        failover::release(cx.store(), h, retries);
    }
}

/// The response reached its end of stream: a 2xx/3xx is judged now, from what the response showed (no
/// property is read for it, in `on_log` either), so that `on_log` has nothing left to do for it.
pub(super) fn at_end_of_stream(cx: &mut Cx, f: &mut Forwarded) {
    if f.resp.ended && (200..400).contains(&f.resp.status) {
        record(cx, f);
    }
}

/// Reports this request's outcome to the breakers that admitted it.
pub(super) fn record(cx: &mut Cx, f: &mut Forwarded) {
    if f.charges.breakers.is_empty() {
        return;
    }
    let cfg = cx.cfg;
    let Some(b) = &cfg.breaker else {
        return;
    };
    let status = if f.resp.status != 0 {
        f.resp.status
    } else {
        cx.host
            .property(&["response", "code"])
            .and_then(|v| crate::store::read_u64(&v, 0))
            .map(|c| u32::try_from(c).unwrap_or(0))
            .unwrap_or(0)
    };
    // A 2xx/3xx that reached its end of stream came whole from the upstream ("via_upstream"): its
    // details cannot change the outcome, so the property is not read.
    let details = if f.resp.ended && (200..400).contains(&status) {
        None
    } else {
        cx.host
            .property(&["response", "code_details"])
            .and_then(|v| String::from_utf8(v).ok())
    };
    let completed = if b.count_incomplete_streams {
        f.resp.stream.as_ref().map(SseScanner::completed)
    } else {
        None
    };
    if !b.count_incomplete_streams
        && f.resp.stream.is_some()
        && breaker::cut_after_response_started(status, details.as_deref())
    {
        // A stream the upstream cut after it had started: that is what the option turns off (the
        // reset would otherwise count as one).
        return;
    }
    let Some(outcome) = breaker::classify(status, details.as_deref(), completed, &b.policy) else {
        return;
    };
    let outcome = if outcome == Outcome::Success {
        outcome
    } else {
        let resets: Vec<&str> = f.resp.reset_headers.iter().map(String::as_str).collect();
        outcome.with_retry_after(breaker::retry_after_ms(
            f.resp.retry_after.as_deref(),
            &resets,
        ))
    };
    // The time is asked for only when an outcome is written or gathered (a host call).
    let mut now = None;
    for held in std::mem::take(&mut f.charges.breakers) {
        // A plain success changes nothing unless successes are counted for a failure rate: no
        // shared-data access, and the breaker need not even be named.
        if breaker::record_is_noop(&b.cfg, outcome, held.probe) {
            continue;
        }
        let name: Cow<str> = match (held.name, held.scope) {
            (Some(n), _) => Cow::Owned(n),
            (None, "model") => Cow::Borrowed(f.model.as_str()),
            (None, _) => match cx
                .host
                .property(&["xds", "cluster_name"])
                .and_then(|v| String::from_utf8(v).ok())
                .filter(|c| !c.is_empty())
            {
                Some(c) => Cow::Owned(c),
                None => continue,
            },
        };
        let now = *now.get_or_insert_with(|| cx.now());
        let r = {
            let mut ctx = Ctx {
                store: cx.host.store(),
                settings: b,
                vm: &mut cx.worker.breakers,
                known: &mut cx.worker.known_keys,
                cache_limit: KNOWN_KEYS_CACHE,
                retries: cfg.cas_max_retries,
            };
            failover::record(&mut ctx, held.scope, &name, outcome, held.probe, now)
        };
        if let (Some(t), Some(key)) = (r.transition, r.key.as_deref()) {
            super::end::transition(cx, key, t);
        }
        if let Some(e) = r.error {
            cx.inc(Metric::StoreErrors);
            cx.log_failure(
                Level::Warn,
                "breaker_store",
                format!(
                    "breaker update failed at {}: {e:?}",
                    r.key.as_deref().unwrap_or(held.scope)
                ),
            );
        }
    }
    if let Some(now) = now {
        flush(cx, now, false);
    }
}

/// Writes the successes this VM gathered for failure-rate breakers: the due ones, or all (`all`: the
/// VM's tick).
pub(super) fn flush(cx: &mut Cx, now: u64, all: bool) {
    let Some(b) = &cx.cfg.breaker else {
        return;
    };
    // The tick goes on (it also forgets what is stale); a request's end only when something waits.
    if !all && !cx.worker.breakers.pending.any() {
        return;
    }
    let failed = {
        let mut ctx = Ctx {
            store: cx.host.store(),
            settings: b,
            vm: &mut cx.worker.breakers,
            known: &mut cx.worker.known_keys,
            cache_limit: KNOWN_KEYS_CACHE,
            retries: cx.cfg.cas_max_retries,
        };
        failover::flush(&mut ctx, now, all)
    };
    for (key, e) in failed {
        cx.inc(Metric::StoreErrors);
        cx.log_failure(
            Level::Warn,
            "breaker_store",
            format!("breaker update failed at {key}: {e:?} (successes not counted)"),
        );
    }
}
