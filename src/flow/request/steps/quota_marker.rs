//! Headers step: a tenant whose monthly quota Redis refused moments ago, remembered in shared data
//! ([`ExhaustedMarker`]), is refused (429) without a callout. A tenant this VM is serving from a lease is
//! not refused from its marker (one shared-data read less per request; see
//! [`Leases::served_recently`](crate::flow::vm::state::Leases::served_recently)). The quota step reads the
//! marker of a budget's account the same way ([`exhausted`]).

use crate::config::QuotaSettings;
use crate::flow::cx::Cx;
use crate::flow::effect::Headers;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::state::Meta;
use crate::quota::ExhaustedMarker;
use crate::reply::Refusal;

/// Refuses a tenant known to have spent its month.
pub(in crate::flow) fn check(
    cx: &mut Cx,
    _h: &dyn Headers,
    meta: &mut Meta,
) -> Result<(), Box<Denial>> {
    let Some(q) = &cx.cfg.quota else {
        return Ok(());
    };
    // A recent time (no clock read): the marker only saves a refused request its callout, so a
    // window that runs late by the gap between this VM's requests costs nothing else.
    let now = cx.host.recent_ns();
    let leased = q.lease.is_some() && cx.worker.leases.served_recently(&meta.tenant, now);
    match (!leased).then(|| exhausted(cx, q, &meta.tenant)).flatten() {
        Some(refusal) => Err(Denial::new(Reason::QuotaExceededCached, refusal)),
        None => Ok(()),
    }
}

/// The 429 of an account (a tenant, or a budget's) known to be exhausted, from its shared-data marker.
pub(in crate::flow) fn exhausted(cx: &Cx, q: &QuotaSettings, account: &str) -> Option<Refusal> {
    let now_s = q.now_s(cx.now());
    let key = ExhaustedMarker::key(account);
    let (marker, _) = crate::store::peek::<ExhaustedMarker>(cx.store(), &key).ok()?;
    let marker = marker?;
    if !marker.is_active(now_s) || marker.config_limit != q.account_limit(account) {
        return None;
    }
    Some(answers::quota_exceeded(
        marker.limit,
        marker.remaining,
        crate::quota::calendar::month_end_unix(now_s, q.month_offset_minutes),
        now_s,
        "for this tenant",
    ))
}
