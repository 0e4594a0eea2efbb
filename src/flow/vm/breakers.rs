//! The request breakers (cluster, model), the VM's side: the one read of the set of open breakers
//! ([`view`]), outcomes written to the breakers that admitted a request ([`write`]) — successes of a
//! failure-rate breaker gathered in this VM and written in batches ([`flush`], also at every tick) —
//! and the log line, counter and gauge of a transition ([`transition`]). The mechanics and their
//! staleness bounds are in [`crate::breaker::failover`].

use super::state::KNOWN_KEYS_CACHE;
use crate::breaker::failover::{self, Ctx, Held};
use crate::breaker::{self, Outcome, Transition, View};
use crate::flow::cx::Cx;
use crate::flow::effect::{Effect, Level};
use crate::flow::metric::Metric;
use std::borrow::Cow;

/// Reads the set of open breakers, counting (and repairing) a corrupt one.
pub fn view(cx: &mut Cx) -> View {
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

/// Logs and counts a breaker transition.
pub fn transition(cx: &mut Cx, key: &str, t: Transition) {
    cx.log(
        Level::Info,
        format!(
            "breaker {key}: {} -> {} ({})",
            t.from.as_str(),
            t.to.as_str(),
            t.reason
        ),
    );
    cx.inc(match t.to {
        breaker::State::Open => Metric::BreakerOpened,
        breaker::State::HalfOpen => Metric::BreakerHalfOpened,
        breaker::State::Closed => Metric::BreakerClosed,
    });
    cx.fx.push(Effect::Gauge(
        format!(
            "tokengate_breaker_state.{}",
            key.strip_prefix(crate::store::keys::BREAKER).unwrap_or(key)
        ),
        failover::gauge(t.to),
    ));
}

/// Writes `outcome` to every breaker in `held` (what admitted the request); `model`: the request's
/// model, which names a model breaker seen closed.
pub fn write(cx: &mut Cx, held: Vec<Held>, outcome: Outcome, model: &str) {
    let cfg = cx.cfg;
    let Some(b) = &cfg.breaker else {
        return;
    };
    // The time is asked for only when an outcome is written or gathered (a host call).
    let mut now = None;
    for held in held {
        // A plain success changes nothing unless successes are counted for a failure rate: no
        // shared-data access, and the breaker need not even be named.
        if breaker::record_is_noop(&b.cfg, outcome, held.probe) {
            continue;
        }
        let name: Cow<str> = match (held.name, held.scope) {
            (Some(n), _) => Cow::Owned(n),
            (None, "model") => Cow::Borrowed(model),
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
            transition(cx, key, t);
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
pub fn flush(cx: &mut Cx, now: u64, all: bool) {
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
