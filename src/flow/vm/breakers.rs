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

/// How long the body phase reuses the headers phase's read of the set of open breakers (ms): a breaker
/// opened by another worker within it admits this request as the headers phase saw it (the same
/// staleness as a set read just before it opened).
pub const OPEN_SET_REUSE_MS: u64 = 100;

/// True while a read of the set made at `at` (ns) may stand for one made now.
pub fn fresh(cx: &Cx, at: u64) -> bool {
    cx.now().saturating_sub(at) < OPEN_SET_REUSE_MS * 1_000_000
}

/// The request's upstream cluster (`xds.cluster_name`). A read costs about 12.8k instructions in
/// callgrind on Envoy 1.40 (the `xds` attributes are a CEL map); the older top-level `cluster_name`
/// is not answered there.
pub fn cluster_name(cx: &Cx) -> Option<String> {
    cx.host
        .property(&["xds", "cluster_name"])
        .and_then(|v| String::from_utf8(v).ok())
        .filter(|c| !c.is_empty())
}

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
    // The time is asked for only when an outcome is written or gathered. A plain success of a
    // failure-rate breaker is gathered at a recent time ([`crate::flow::Host::recent_ns`]: no host call
    // in a VM that serves requests); the time is read when something is written.
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
            (None, _) => match cluster_name(cx) {
                Some(c) => Cow::Owned(c),
                None => continue,
            },
        };
        let gathered = outcome == Outcome::Success && !held.probe;
        let now = if gathered {
            *now.get_or_insert_with(|| cx.host.recent_ns())
        } else {
            let t = cx.now();
            now = Some(t);
            t
        };
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
    if let Some(recent) = now {
        if cx.worker.breakers.pending.due(recent) {
            let now = cx.now();
            flush(cx, now, false);
        }
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
