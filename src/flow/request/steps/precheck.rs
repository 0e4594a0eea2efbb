//! Headers step: a rule or limit that certainly applies (the model is known from the path or
//! `model_header`, or does not matter to it) and cannot admit even one more request is refused (429) before the upstream is
//! contacted: its bucket is empty (read, not charged; a global bucket's from its refusal cache) or its
//! in-flight slots are all held. Shadow limits are left to the body phase (they only count). The bucket
//! read is kept: the body phase's charge of the same key starts from it (its CAS catches any write in
//! between).

use super::limits::{slot_key, subject};
use crate::config::ModelMatch;
use crate::flow::cx::Cx;
use crate::flow::effect::Headers;
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::Denial;
use crate::flow::request::state::Meta;
use crate::global;
use crate::limits::{fair, local};

/// Refuses a request a bucket or in-flight limit cannot pass.
pub(in crate::flow) fn check(
    cx: &mut Cx,
    _h: &dyn Headers,
    meta: &mut Meta,
) -> Result<(), Box<Denial>> {
    let cfg = cx.cfg;
    // The model the path names decides; `model_header` is only a hint (a wrong one can only refuse
    // early what its sender asked for: the body phase charges the body's model).
    let named = meta.path_model.as_deref().or(meta.model_hint.as_deref());
    let model = named.unwrap_or_default().to_string();
    let mut idxs: Vec<usize> = match named {
        Some(m) => cfg.rule_for(&meta.tenant, m),
        None => cfg.rule_without_model(&meta.tenant),
    }
    .into_iter()
    .collect();
    let base = cfg.rules.len();
    for (j, l) in cfg.limits.iter().enumerate() {
        let known =
            named.is_some() || (l.model == ModelMatch::Any && !(l.per_model && l.has_bucket));
        if known && !l.shadow && l.applies(&meta.tenant, &meta.groups, &model) {
            idxs.push(base + j);
        }
    }
    if idxs.is_empty() {
        // Nothing to read (and no clock read: a host call).
        return Ok(());
    }
    let now = cx.now();
    for idx in idxs {
        let Some(rule) = cfg.rule(idx) else {
            return Ok(());
        };
        let who = subject(cfg, rule, meta);
        if let Some(max) = rule.max_in_flight {
            let key = slot_key(rule, &who);
            if crate::limits::inflight::in_flight(cx.store(), &key, now)
                .is_ok_and(|n| n >= usize::try_from(max).unwrap_or(usize::MAX))
            {
                let refusal = answers::too_many_in_flight(rule, max, &cfg.groups);
                return Err(Denial::bucket(refusal).naming(model));
            }
        }
        if !rule.has_bucket {
            continue;
        }
        if rule.fair.is_some() {
            // A fair record: only an empty bucket refuses here (the share is decided in the body
            // phase, where the ask counts); a global one is left to the body phase.
            if rule.global && cfg.global.is_some() {
                continue;
            }
            let key = fair_key(cx, rule, &who, &model);
            let mut seen = None;
            match fair::precheck(cx.store(), rule, &key, now, &mut seen) {
                Ok(Some(refusal)) => {
                    super::fair::count_refusal(cx, rule, false);
                    return Err(Denial::bucket(refusal).naming(model));
                }
                Ok(None) => {
                    if meta.prechecked.is_none() {
                        meta.prechecked = seen.map(|seen| (key, seen));
                    }
                }
                Err(true) => cx.inc(Metric::StateCorrupt),
                Err(false) => cx.inc(Metric::StoreErrors),
            }
            continue;
        }
        if rule.global && cfg.global.is_some() {
            // A global bucket is in Redis: only its refusal cache is read here.
            let key = global::key(rule, &who, &model);
            let leases = cfg.global.as_ref().is_some_and(|g| g.lease.is_some());
            if let Some(refusal) =
                global::refused_from_cache(cx.store(), rule, &key, 1, now, leases)
            {
                cx.inc(Metric::GlobalRejectedCached);
                return Err(Denial::bucket(refusal).naming(model));
            }
        } else {
            let key = local::plain_key(rule, &who, &model);
            let mut seen = None;
            match local::precheck(cx.store(), rule, &key, now, &mut seen) {
                Ok(Some(refusal)) => return Err(Denial::bucket(refusal).naming(model)),
                Ok(None) => {
                    if meta.prechecked.is_none() {
                        meta.prechecked = seen.map(|seen| (key, seen));
                    }
                }
                // The body phase reads again and repairs; nothing is decided here.
                Err(true) => cx.inc(Metric::StateCorrupt),
                Err(false) => cx.inc(Metric::StoreErrors),
            }
        }
    }
    Ok(())
}

/// The key of a fair record, as the fair step will charge it (without claiming a key slot: a precheck
/// creates nothing).
fn fair_key(cx: &Cx, rule: &crate::config::Rule, who: &str, model: &str) -> String {
    let _ = cx;
    let plain = local::plain_key(rule, who, model);
    format!(
        "{}{}",
        fair::PREFIX,
        plain
            .strip_prefix(crate::store::keys::BUCKET)
            .unwrap_or(&plain)
    )
}
