//! The Webdis shims (quota and global buckets) as the flow sees them: one breaker per cluster in shared
//! data (`tg:cb:shim=<cluster>`), shared by whoever calls that cluster; while it is open no callout is
//! made and the caller's failure policy applies at once, so a dead Webdis costs one timeout per recovery
//! window. Also the one way a shim's answer is read ([`read`]): the host's refusal to dispatch, an
//! outage and a reply that does not parse all come back as a [`Failure`] naming the cluster; what to do
//! on NOSCRIPT (send again as `EVAL`) is each caller's, since when it may resend differs.

use super::cx::Cx;
use super::effect::{Callout, CalloutReply, Level, Purpose};
use crate::breaker::{self, Admission, BreakerConfig, Outcome};
use crate::shim::webdis::{ScriptCall, ShimError};

/// The shim breaker key of a cluster.
pub fn key(cluster: &str) -> String {
    breaker::key("shim", cluster)
}

/// Asks the breaker of the shim at `cluster` whether a callout may be made now: `Ok(probe)`, or
/// `Err(ms until it may)` while it is open.
pub fn admit(cx: &mut Cx, cluster: &str, cfg: &BreakerConfig) -> Result<bool, u64> {
    let now = cx.now();
    let retries = cx.cfg.cas_max_retries;
    match breaker::admit_shared(cx.store(), &key(cluster), cfg, now, retries) {
        Ok((a, t, _)) => {
            if let Some(t) = t {
                log_transition(cx, cluster, t);
            }
            match a {
                Admission::Rejected { reset_in_ms } => Err(reset_in_ms),
                Admission::Probe => Ok(true),
                Admission::Allowed => Ok(false),
            }
        }
        // The store failed: do not block traffic on it.
        Err(_) => Ok(false),
    }
}

/// Reports a callout outcome to the breaker of the shim at `cluster`.
pub fn record(cx: &mut Cx, cluster: &str, cfg: &BreakerConfig, ok: bool, probe: bool) {
    let outcome = if ok {
        Outcome::Success
    } else {
        Outcome::Failure {
            retry_after_ms: None,
        }
    };
    let now = cx.now();
    let retries = cx.cfg.cas_max_retries;
    if breaker::record_is_noop(cfg, outcome, probe) {
        return;
    }
    if let Ok((Some(t), _)) =
        breaker::record_shared(cx.store(), &key(cluster), cfg, outcome, probe, now, retries)
    {
        log_transition(cx, cluster, t);
    }
}

/// True while the shim breaker of `cluster` is open (queued work waits).
pub fn is_open(cx: &Cx, cluster: &str, cfg: &BreakerConfig) -> bool {
    match crate::store::peek::<breaker::BreakerState>(cx.store(), &key(cluster)) {
        Ok((Some(st), _)) => breaker::peek_state(&st, cfg, cx.now()).1 > 0,
        _ => false,
    }
}

/// Background callouts (lease syncs and give-backs, queued credits) ask here before each tick's
/// batch: `None` while the breaker is open (or half-open with its probes out: nothing is sent),
/// `Some(false)` while it is closed (a batch may go), `Some(true)` with a half-open probe permit taken:
/// one callout only, whose outcome is recorded as the probe ([`record`] with `probe`), or the permit
/// given back ([`release_probe`]) if none is made. Without it, failed background work sent again at
/// every tick once the recovery time had passed, and never re-opened the breaker.
pub fn admit_background(cx: &mut Cx, cluster: &str, cfg: &BreakerConfig) -> Option<bool> {
    match crate::store::peek::<breaker::BreakerState>(cx.store(), &key(cluster)) {
        Ok((Some(st), _)) => match breaker::peek_state(&st, cfg, cx.now()) {
            (_, wait) if wait > 0 => None,
            (breaker::State::Closed, _) => Some(false),
            _ => admit(cx, cluster, cfg).ok(),
        },
        _ => Some(false),
    }
}

/// Gives back a probe permit taken by [`admit_background`] that no callout used.
pub fn release_probe(cx: &mut Cx, cluster: &str) {
    let retries = cx.cfg.cas_max_retries;
    let _ = breaker::release_probe_shared(cx.store(), &key(cluster), retries);
}

fn log_transition(cx: &mut Cx, cluster: &str, t: breaker::Transition) {
    cx.log(
        Level::Warn,
        format!(
            "webdis shim {cluster}: {} -> {} ({})",
            t.from.as_str(),
            t.to.as_str(),
            t.reason
        ),
    );
}

/// A callout to the shim at `cluster`.
pub fn callout(
    purpose: Purpose,
    cluster: &str,
    authority: &str,
    timeout_ms: u32,
    body: String,
) -> Callout {
    Callout {
        purpose,
        cluster: cluster.to_string(),
        authority: authority.to_string(),
        timeout_ms,
        body,
    }
}

/// Which script call to use: `EVALSHA` once Redis answered one of ours, else `EVAL` (which also loads
/// the script into Redis' cache).
pub fn script_call(loaded: bool) -> ScriptCall {
    if loaded {
        ScriptCall::EvalSha
    } else {
        ScriptCall::Eval
    }
}

/// Why a reply counts as a shim failure, for logs: names the cluster.
pub fn describe_refusal(cluster: &str, status: u32) -> String {
    format!("the host refused a callout to cluster '{cluster}' (status {status}: is the cluster defined in Envoy?)")
}

pub use crate::shim::webdis::Failure;

/// Reads a shim's answer to a call to `cluster` with `parse` (the script's reply parser).
pub fn read<T>(
    cluster: &str,
    reply: &CalloutReply,
    parse: impl FnOnce(u32, &[u8]) -> Result<T, ShimError>,
) -> Result<T, Failure> {
    match reply.refused {
        Some(s) => Err(Failure {
            error: ShimError::Unavailable,
            why: describe_refusal(cluster, s),
        }),
        None => parse(reply.status, &reply.body).map_err(|e| Failure {
            why: format!("{e} (cluster '{cluster}')"),
            error: e,
        }),
    }
}
