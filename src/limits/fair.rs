//! Fair sharing of one limit's bucket (`share: "fair"`): weighted max-min shares among the members
//! (tenants, or groups of a level) active in the last window, strict priority levels, work-conserving.
//! Pure: a [`SharedStore`], time as a parameter; docs/fair-share.md has the design and its bounds.
//!
//! **One record per bucket**, charged with one CAS like a plain bucket (`tg:fs:<limit>:<subject>[:<model>]`):
//! the bucket itself, the water levels of the last share computation, and a table of members:
//! ```text
//! header (200 bytes): [v=1][levels u8][members u16 K][active u16][reserved u16]
//!                     [tokens f64][requests f64][updated_ns u64]        the bucket (as limits::bucket)
//!                     [computed_ns u64][r_eff f64][avg_cost f64][reserve f64][protected f64]
//!                     [lambda f64 × 8][cap f64 × 8]   per level: water level and what the level gets, or
//!                                                     (λ unbounded) what it leaves over per unit of weight
//! member (64 bytes) × (K + 1, the last one shared by members without a slot):
//!                     [hash u64][last_ns u64][credited_ns u64][demand f64][credit f64][norm f64]
//!                     [weight f32][largest request f32][level u8][flags u8][0 × 6]
//! ```
//! Per request, inside the CAS ([`decide`]):
//! 1. the bucket is refilled; every `window / 100` the shares are recomputed by whichever request finds
//!    them stale: each active member's **demand** (tokens asked per second, admitted or not, an
//!    exponential average over half the window) is water-filled, level by level, into the **effective
//!    rate** `r_eff = rate + (tokens − reserve) / (window / 2)`: a member asking less than its weighted
//!    share is counted at its demand, the others share the rest by weight (water level `λ`); a level gets
//!    only what the levels above it leave. `r_eff` steers the bucket's balance to the reserve: capacity
//!    nobody uses raises every share, a balance below the reserve lowers them (lowest level first). The
//!    reserve holds the largest recent request of every member under its share (see [`Tuning`]);
//! 2. the member's **credit** refills at its share (`min(λ × weight, level cap)`; where a whole level
//!    gets what it asks, its demand plus its weight's part of the leftover), at most half a window of it,
//!    and its demand takes the request's cost;
//! 3. the request is admitted when the bucket holds its cost and the member's credit is positive (the
//!    credit may then go into debt by one request); else it is refused — *over share* when the bucket held
//!    the cost, *limit empty* when it did not. Either way the record is written (the demand counts).
//!
//! What it guarantees: the bucket alone decides the total, so the tokens admitted never exceed
//! `burst + rate × t`, exact across workers (one CAS); a member admitted only with credit gets at most its
//! share × t + half a window of share + one request. Members beyond `max_members` active at once share the
//! last member's slot (counted: [`ShareView::overflow`]); a member silent for a window frees its slot.

use crate::config::{Config, FairShare, Rule, ShareBy};
use crate::limits::bucket::{self, BucketParams, BucketState, Snapshot, Verdict};
use crate::limits::local::{self, Decision, KeyInfo};
use crate::reply::{Class, Limits, Refusal};
use crate::store::hash::{fnv1a, FNV_OFFSET};
use crate::store::registry::{claim_slot, KeySet};
use crate::store::{self, keys, Codec, SharedStore, UpdateError, UpdateStats};
use std::borrow::Cow;

pub mod global;
mod record;
#[cfg(test)]
mod tests;

use record::OVERFLOW;
pub use record::{Record, LEVELS};

/// Shared-data key prefix of fair records: `tg:fs:<limit>:<subject>[:<model>]`.
pub const PREFIX: &str = "tg:fs:";

/// The timing of a fair limit, all derived from its `window`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// Time constant of the demand average, s (half the window).
    pub tau_s: f64,
    /// A member silent this long is no longer active and frees its slot, ns (the window).
    pub idle_ns: u64,
    /// Shares older than this are recomputed, ns (a hundredth of the window).
    pub recompute_ns: u64,
    /// How fast the effective rate steers the balance back to the reserve, s (half the window).
    pub steer_s: f64,
    /// The balance shares aim at is at least this much of the rate, s (a tenth of the window); see
    /// [`Tuning::reserve`].
    pub reserve_s: f64,
    /// A member banks at most this much of its share, s (half the window).
    pub bank_s: f64,
    /// Weight of a member without a slot of its own (the overflow member).
    pub default_weight: f64,
    /// Level of the overflow member.
    pub default_level: u8,
}

impl Tuning {
    /// The timing of `share`.
    pub fn of(share: &FairShare) -> Tuning {
        let w = share.window_ns.max(1_000_000) as f64 / 1e9;
        Tuning {
            tau_s: w / 2.0,
            idle_ns: share.window_ns,
            recompute_ns: share.window_ns / 100,
            steer_s: w / 2.0,
            reserve_s: w / 10.0,
            bank_s: w / 2.0,
            default_weight: share.default_weight,
            default_level: share.default_level,
        }
    }

    /// The balance shares aim at: a tenth of a window of the rate, at least four average requests, and
    /// at least the `protected` tokens (the largest recent request of each member under its share) with
    /// two average requests more; at most three quarters of the burst.
    pub fn reserve(&self, p: &BucketParams, avg_cost: f64, protected: f64) -> f64 {
        (p.tokens_per_second * self.reserve_s)
            .max(4.0 * avg_cost)
            .max(protected + 2.0 * avg_cost)
            .min(p.burst * 0.75)
    }
}

/// Who is asking, as the record knows them.
#[derive(Debug, Clone, PartialEq)]
pub struct Member<'a> {
    /// The member's id (tenant, or group path), for logs.
    pub id: Cow<'a, str>,
    /// FNV-1a of the id (never 0 nor `u64::MAX`).
    pub hash: u64,
    /// Its weight.
    pub weight: f64,
    /// Its priority level (0 highest).
    pub level: u8,
}

/// The member a request of `tenant` (in `groups`, of the config's group `levels`) is, for `share`.
/// Without a group at the share's level, every such request is one member, `~none`.
pub fn member<'a>(
    share: &FairShare,
    tenant: &'a str,
    levels: &[crate::config::GroupLevel],
    groups: &[Option<String>],
) -> Member<'a> {
    let (id, name): (Cow<'a, str>, Cow<'_, str>) = match share.by {
        ShareBy::Tenant => (Cow::Borrowed(tenant), Cow::Borrowed(tenant)),
        ShareBy::Level(l) => match groups.get(l).and_then(Option::as_deref) {
            Some(g) => (
                crate::config::Scope::Group(l).subject(tenant, levels, groups),
                Cow::Owned(g.to_string()),
            ),
            None => (Cow::Borrowed("~none"), Cow::Borrowed("~none")),
        },
    };
    let (weight, level) = share.weight_and_level(&name);
    let hash = match fnv1a(FNV_OFFSET, id.as_bytes()) {
        0 => 1,
        OVERFLOW => OVERFLOW - 1,
        h => h,
    };
    Member {
        id,
        hash,
        weight,
        level,
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The bucket held the cost, but the member has used its share.
    OverShare,
    /// The bucket did not hold the cost (or had no request left).
    LimitEmpty,
}

/// What one decision of [`decide`] says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Charged: the bucket's snapshot after the charge.
    Admit(Snapshot),
    /// Not charged.
    Refuse {
        /// Why.
        why: Why,
        /// What the bucket said (for a limit-empty refusal, its verdict with the reset time).
        verdict: Verdict,
        /// The bucket's snapshot.
        snapshot: Snapshot,
        /// Seconds until the member's credit is positive again (over share).
        retry_s: f64,
    },
    /// The cost is larger than the burst: never admitted, nothing written.
    TooLarge(Snapshot),
}

/// What a decision leaves besides the step: the member's share and the table's state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareView {
    /// The member's share now, tokens/s.
    pub share: f64,
    /// What the member may still take now (its credit), tokens; negative while in debt.
    pub credit: f64,
    /// Members active at the last share computation.
    pub active: u16,
    /// The member had no slot of its own (more than `max_members` active).
    pub overflow: bool,
    /// The fair share per unit of weight (the water level `λ`, tokens/s) of the first priority level
    /// that binds at the last share computation; 0 when every member gets what it asks.
    pub level_share: f64,
}

/// The decision on a request of `cost` tokens by `m` at `now`, and the record to write (`None`: nothing).
/// A record made for another member count or level count keeps its bucket and starts its table afresh.
pub fn decide(
    rec: &Record,
    share: &FairShare,
    p: &BucketParams,
    t: &Tuning,
    m: &Member,
    cost: u64,
    now: u64,
) -> (Step, ShareView, Option<Record>) {
    let levels = u8::try_from(share.levels.len().clamp(1, LEVELS)).unwrap_or(1);
    let mut r = if rec.members() == share.max_members && rec.levels() == levels {
        rec.clone()
    } else {
        Record::fresh(share.max_members, levels, &rec.bucket())
    };
    let b = r.bucket().refilled(p, now);
    let costf = cost as f64;
    if costf > p.burst {
        let view = ShareView {
            share: 0.0,
            credit: 0.0,
            active: r.active(),
            overflow: false,
            level_share: level_share(&r, levels),
        };
        return (Step::TooLarge(b.snapshot(p)), view, None);
    }
    r.refresh(p, t, b.tokens, costf, now);
    let e = r.enter(m, t, costf, now);
    let (rate, credit, overflow) = (e.rate, e.credit, e.overflow);
    let (v, snap, next) = bucket::charge(&b, p, cost, now, 0);
    let (step, credit) = match (v, next) {
        (Verdict::Admit, Some(next)) if credit > 0.0 => {
            r.set_bucket(&next);
            (Step::Admit(snap), credit - costf)
        }
        (Verdict::Admit, Some(_)) => {
            let retry_s = if rate > 0.0 {
                (-credit / rate).max(0.001)
            } else {
                t.idle_ns as f64 / 1e9
            };
            let step = Step::Refuse {
                why: Why::OverShare,
                verdict: v,
                snapshot: snap,
                retry_s,
            };
            (step, credit)
        }
        _ => {
            let step = Step::Refuse {
                why: Why::LimitEmpty,
                verdict: v,
                snapshot: snap,
                retry_s: 0.0,
            };
            (step, credit)
        }
    };
    r.asked(&e, t, costf, credit, now);
    let view = ShareView {
        share: rate,
        credit,
        active: r.active(),
        overflow,
        level_share: level_share(&r, levels),
    };
    (step, view, Some(r))
}

/// The water level of the first of `levels` priority levels of `r` that binds (0: none does).
fn level_share(r: &Record, levels: u8) -> f64 {
    (0..usize::from(levels))
        .find_map(|l| r.lambda(l))
        .unwrap_or(0.0)
}

/// Gives `amount` tokens back to the bucket (never above the burst) and to member `hash`'s credit
/// (`amount` < 0 takes them, the bucket down to −burst); the member may have lost its slot since.
pub fn adjust(rec: &Record, p: &BucketParams, hash: u64, amount: f64, now: u64) -> Record {
    let mut r = rec.clone();
    let b = r.bucket().refilled(p, now);
    r.set_bucket(&BucketState {
        tokens: (b.tokens + amount).clamp(-p.burst, p.burst),
        ..b
    });
    r.give(hash, amount, p.burst);
    r
}

/// The shared-data key of `rule`'s record for `subject` (and model, for per-model limits), bounded like
/// bucket keys by `max_tenants` (`tg:n:buckets`); past it, one of 64 overflow records of the limit.
pub fn record_key(
    store: &dyn SharedStore,
    cfg: &Config,
    known: &mut KeySet,
    cache_limit: usize,
    rule: &Rule,
    subject: &str,
    model: &str,
) -> (String, KeyInfo) {
    let plain = local::plain_key(rule, subject, model);
    let key = format!(
        "{PREFIX}{}",
        plain.strip_prefix(keys::BUCKET).unwrap_or(&plain)
    );
    if claim_slot(
        store,
        local::KEY_COUNTER,
        cfg.max_tenants,
        cfg.cas_max_retries,
        known,
        cache_limit,
        &key,
    ) {
        (key, KeyInfo::default())
    } else {
        let n = fnv1a(FNV_OFFSET, key.as_bytes()) % local::OVERFLOW_SLOTS;
        (
            format!("{PREFIX}{}:~overflow{n}", rule.name),
            KeyInfo { overflow: true },
        )
    }
}

/// The result of [`charge`].
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// As for a plain bucket: admitted (with the bucket's snapshot), refused (the 429/413), or the store
    /// failed (the caller applies `on_store_error`).
    pub decision: Decision,
    /// Why it was refused, for metrics.
    pub why: Option<Why>,
    /// The member's share and the table's state (zeros when the store failed).
    pub view: ShareView,
}

/// What a missing (or corrupt) record starts as: a full bucket and no table (264 bytes; [`decide`] gives
/// it the configured table when it first writes it, so the common path never builds a whole record it
/// does not need).
fn fresh_for(rule: &Rule, now: u64) -> Record {
    Record::fresh(0, 1, &BucketState::full(&rule.params, now))
}

/// Body-phase charge of `cost` tokens and one request by member `m` on `key` (one CAS; starts from the
/// headers-phase read `seen` when given). A rule without `fair` is charged as a plain bucket would be
/// refused: callers only call this for fair limits.
#[allow(clippy::too_many_arguments)]
pub fn charge(
    store: &dyn SharedStore,
    cfg: &Config,
    rule: &Rule,
    key: &str,
    m: &Member,
    cost: u64,
    now: u64,
    seen: Option<store::Seen>,
) -> (Outcome, UpdateStats) {
    let none = ShareView {
        share: 0.0,
        credit: 0.0,
        active: 0,
        overflow: false,
        level_share: 0.0,
    };
    let Some(share) = rule.fair.as_deref() else {
        let (decision, stats) = local::charge(store, cfg, rule, key, cost, now, seen);
        return (
            Outcome {
                decision,
                why: None,
                view: none,
            },
            stats,
        );
    };
    let t = Tuning::of(share);
    let init = fresh_for(rule, now);
    let result = store::update_from(store, key, cfg.cas_max_retries, &init, seen, |r| {
        let (step, view, next) = decide(r, share, &rule.params, &t, m, cost, now);
        ((step, view), next)
    });
    let ((step, view), stats) = match result {
        Err(e) => {
            let o = Outcome {
                decision: Decision::StoreFailed(e),
                why: None,
                view: none,
            };
            return (o, UpdateStats::default());
        }
        Ok(x) => x,
    };
    let (decision, why) = match step {
        Step::Admit(snapshot) => (
            Decision::Admit {
                snapshot,
                cost,
                wait_ms: 0,
            },
            None,
        ),
        Step::TooLarge(snap) => (local::decision(Verdict::TooLarge, snap, rule, cost), None),
        Step::Refuse {
            why: Why::LimitEmpty,
            verdict,
            snapshot,
            ..
        } => (
            local::decision(verdict, snapshot, rule, cost),
            Some(Why::LimitEmpty),
        ),
        Step::Refuse {
            why: Why::OverShare,
            retry_s,
            ..
        } => (
            Decision::Reject(over_share(rule, share, &view, retry_s)),
            Some(Why::OverShare),
        ),
    };
    (
        Outcome {
            decision,
            why,
            view,
        },
        stats,
    )
}

/// The 429 of a member over its share: a rate limit on tokens, naming the limit, the member's share and
/// how many share the limit; `x-ratelimit-*` report the member's bank (what it may take at once).
fn over_share(rule: &Rule, share: &FairShare, view: &ShareView, retry_s: f64) -> Refusal {
    let who = match share.by {
        ShareBy::Tenant => "tenants",
        ShareBy::Level(_) => "groups",
    };
    let mut r = Refusal::new(
        Class::TokensPerSecond,
        format!(
            "Fair share reached for tokens (limit '{}'): {} {who} share {} tokens/s, this one's share is {:.0} tokens/s now.",
            rule.name, view.active.max(1), rule.params.tokens_per_second, view.share
        ),
    );
    r.retry_after_s = Some(retry_s);
    let bank = view.share * Tuning::of(share).bank_s;
    r.limits = Some(Limits::from(&Snapshot {
        limit_tokens: bank.max(1.0).floor(),
        remaining_tokens: 0,
        reset_tokens_s: retry_s,
        requests: None,
    }));
    r.limit_name = Some(rule.name.clone());
    r
}

/// Headers-phase check, read only: the 429 when the bucket cannot pass even one token (the share is
/// decided in the body phase, where the ask is counted). What was read is left in `seen` for [`charge`].
/// `Err(true)`: the record is corrupt (the charge will start it afresh).
pub fn precheck(
    store: &dyn SharedStore,
    rule: &Rule,
    key: &str,
    now_ns: u64,
    seen: &mut Option<store::Seen>,
) -> Result<Option<Refusal>, bool> {
    let Some((bytes, cas)) = store.get(key).map_err(|_| false)? else {
        return Ok(None);
    };
    let rec = Record::decode(&bytes);
    *seen = Some((bytes, cas));
    let rec = rec.ok_or(true)?;
    Ok(local::refusal_for(&rec.bucket(), rule, 1, now_ns))
}

/// Gives `amount` tokens back to the record at `key` and to member `hash` (a later step refused the
/// request, or it used less than charged); a negative `amount` takes them (usage above the charge).
pub fn credit(
    store: &dyn SharedStore,
    cfg: &Config,
    rule: &Rule,
    key: &str,
    hash: u64,
    amount: i64,
    now: u64,
) -> Result<(), UpdateError> {
    if rule.fair.is_none() {
        return Err(UpdateError::Host);
    }
    if amount == 0 {
        return Ok(());
    }
    let init = fresh_for(rule, now);
    store::update(store, key, cfg.cas_max_retries, &init, |r| {
        ((), Some(adjust(r, &rule.params, hash, amount as f64, now)))
    })
    .map(|_| ())
}
