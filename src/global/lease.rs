//! Global-bucket leases (`global_buckets.lease`): this Envoy holds a *block* of a global bucket — tokens
//! (and requests, when the bucket has requests/minute) already charged in Redis — in shared data, and
//! admits requests from it with one CAS, without a callout. Pure: a [`SharedStore`], time as a
//! parameter; the Redis side is the bucket script itself ([`crate::global::SCRIPT`] grants a block beyond
//! a charge).
//!
//! ```text
//! tg:gl:a:<redis key>   [v=1][tokens][requests][consumed][consumed requests][synced][synced requests]
//!                       [rate f64][request rate f64][last_sync_ns][last_use_ns][asking_since_ns]
//!                       [seen tokens f64][seen requests f64][seen_ns][last_cost][flags u8]
//! tg:gl:i:<n>           "<rule index>\n<rule name>\n<redis key>" of account n (the leader walks them)
//! tg:n:gleases          how many were registered (bounded by max_tenants)
//! tg:gl:c               the claim of the VM that walks them
//! ```
//!
//! * **No over-admission.** A request is admitted from the account only when it holds the request's
//!   cost (and one request); the CAS makes that exact across workers. Everything an account holds was
//!   granted by Redis out of the bucket, so what all Envoys admit never exceeds what the bucket allowed.
//! * **Sizing.** The account measures the bucket's use on this Envoy (tokens and requests per second, an
//!   exponential average over about one horizon) and a block covers `rate × horizon`, at most `max_share`
//!   of the burst (and of requests/minute). A bucket whose expected use within the horizon is below one
//!   request's cost is not leased at all: each request is charged on its own, as without leases. A block
//!   is asked with the charge of a request the account could not cover (one call for both; Redis grants
//!   what it has beyond the request, possibly nothing) or, when the account runs below half a block, by
//!   the tick. One ask per account is in flight at a time, and what an account holds never exceeds
//!   `max_share` of the burst (a late grant beyond it is credited back), so the tokens this Envoy holds
//!   unused — what other Envoys may be refused for — are at most one block per bucket.
//! * **Give back.** An account unused for `idle` is emptied and its tokens and requests credited back to
//!   Redis. Tokens given back by a request (a later step refused it, `refund_unused`) go to the account,
//!   not to Redis (beyond one block, to Redis). A stopped Envoy loses what it held (at most one block per
//!   bucket), and the bucket refills it anyway.

use crate::limits::bucket::{BucketParams, BucketState, Snapshot};
use crate::store::{read_f64, read_u64, Codec, SharedStore};

/// Account key prefix (followed by the bucket's Redis key).
pub const ACCOUNT: &str = "tg:gl:a:";
/// Registry slot key prefix.
pub const SLOT: &str = "tg:gl:i:";
/// Count of accounts registered.
pub const COUNTER: &str = "tg:n:gleases";
/// The claim of the VM that walks the accounts.
pub const LEADER: &str = "tg:gl:c";
/// The accounts the leader walks: [`entry`]s.
pub const REGISTRY: crate::store::registry::Registry = crate::store::registry::Registry {
    counter: COUNTER,
    slot: SLOT,
};

const WANTS_REFILL: u8 = 1;
/// The registry was full when the account was made: the leader never walks it, so it is never leased
/// (nothing in it could be given back when idle).
const UNLISTED: u8 = 2;

/// One account: what this Envoy holds of one global bucket, and how fast it spends it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Account {
    /// Tokens held (charged in Redis, not spent yet).
    pub tokens: u64,
    /// Requests held (buckets with requests/minute).
    pub requests: u64,
    /// Tokens admitted on this bucket by this Envoy (from the lease or per request), monotonic.
    pub consumed: u64,
    /// Requests admitted, monotonic.
    pub consumed_requests: u64,
    /// `consumed` when the rate was last measured.
    pub synced: u64,
    /// `consumed_requests` when the rate was last measured.
    pub synced_requests: u64,
    /// Use, tokens per second (exponential average).
    pub rate: f64,
    /// Use, requests per second.
    pub request_rate: f64,
    /// When the rate was last measured.
    pub last_sync_ns: u64,
    /// When a request last asked (met or not).
    pub last_use_ns: u64,
    /// A block ask in flight since then (0: none).
    pub asking_since_ns: u64,
    /// Redis' token balance as last reported.
    pub seen_tokens: f64,
    /// Redis' request balance as last reported.
    pub seen_requests: f64,
    /// When it was reported (this Envoy's clock).
    pub seen_ns: u64,
    /// The cost of the last request (what a block must at least cover).
    pub last_cost: u64,
    /// `WANTS_REFILL`, `UNLISTED`.
    pub flags: u8,
}

const LEN: usize = 1 + 8 * 16 + 1;

impl Codec for Account {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LEN);
        v.push(1);
        for x in [
            self.tokens,
            self.requests,
            self.consumed,
            self.consumed_requests,
            self.synced,
            self.synced_requests,
            self.rate.to_bits(),
            self.request_rate.to_bits(),
            self.last_sync_ns,
            self.last_use_ns,
            self.asking_since_ns,
            self.seen_tokens.to_bits(),
            self.seen_requests.to_bits(),
            self.seen_ns,
            self.last_cost,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        // Reserved word (keeps the layout 8-aligned for a later field).
        v.extend_from_slice(&0u64.to_le_bytes());
        v.push(self.flags);
        v
    }

    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != LEN || b.first() != Some(&1) {
            return None;
        }
        let u = |i: usize| read_u64(b, 1 + 8 * i);
        let f = |i: usize| read_f64(b, 1 + 8 * i).filter(|x| x.is_finite());
        Some(Account {
            tokens: u(0)?,
            requests: u(1)?,
            consumed: u(2)?,
            consumed_requests: u(3)?,
            synced: u(4)?,
            synced_requests: u(5)?,
            rate: f(6)?,
            request_rate: f(7)?,
            last_sync_ns: u(8)?,
            last_use_ns: u(9)?,
            asking_since_ns: u(10)?,
            seen_tokens: f(11)?,
            seen_requests: f(12)?,
            seen_ns: u(13)?,
            last_cost: u(14)?,
            flags: *b.get(LEN - 1)?,
        })
    }
}

/// How blocks are sized and kept (from `global_buckets.lease`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// A block covers this much of the measured use (seconds).
    pub horizon_s: f64,
    /// At most this fraction of the burst (and of requests/minute) per block.
    pub max_share: f64,
    /// An account unused this long is given back (ns).
    pub idle_ns: u64,
    /// An ask that did not answer for this long is given up (ns).
    pub ask_timeout_ns: u64,
}

impl Policy {
    /// The most tokens and requests one account may hold for a bucket with `p`.
    pub fn caps(&self, p: &BucketParams) -> (u64, u64) {
        let floor = |x: f64| {
            if x.is_finite() && x > 0.0 {
                x.floor() as u64
            } else {
                0
            }
        };
        (
            floor(p.burst * self.max_share),
            floor(p.requests_per_minute.unwrap_or(0.0) * self.max_share),
        )
    }
}

/// What an account should hold: (tokens, requests), or `None` when the bucket is not worth leasing (its
/// expected use within the horizon is below one request, or a block capped at `max_share` could not
/// cover one request of `cost`).
pub fn target(a: &Account, p: &BucketParams, pol: &Policy, cost: u64) -> Option<(u64, u64)> {
    let cost = cost.max(1);
    let (cap_t, cap_r) = pol.caps(p);
    let by_rate = (a.rate * pol.horizon_s).ceil();
    if !by_rate.is_finite() || by_rate < cost as f64 {
        return None;
    }
    let t = (by_rate as u64).min(cap_t);
    if t < cost {
        return None;
    }
    let r = if p.requests_per_minute.is_some() {
        let want = (a.request_rate * pol.horizon_s).ceil();
        let want = if want.is_finite() && want >= 1.0 {
            want as u64
        } else {
            1
        };
        let r = want.min(cap_r);
        if r < 1 {
            return None;
        }
        r
    } else {
        0
    };
    Some((t, r))
}

/// What a request got from its account.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Take {
    /// Admitted from the lease; the account as it is now, and whether it asks for a top-up.
    Hit(Account, bool),
    /// Not covered: the request is charged in Redis, with this block asked beyond it (`None`: none,
    /// another ask is in flight or the bucket is not worth leasing). `true`: the account was new. The
    /// `u64`: tokens of the cost taken from the account (all it held, short of the cost): Redis is
    /// charged only the rest, so a bucket never refuses a request it and this lease could cover
    /// together (the caller gives them back if the request is not admitted).
    Miss(Option<(u64, u64)>, bool, u64),
    /// Shared data failed: the request is charged in Redis on its own.
    Store,
}

/// Takes `cost` tokens (and a request when the bucket has requests/minute) from the account at `key`.
/// A missing account is made only when `may_create()` says so (shared data never evicts a key: the
/// caller bounds how many exist); otherwise the request simply misses.
#[allow(clippy::too_many_arguments)]
pub fn take(
    store: &dyn SharedStore,
    key: &str,
    p: &BucketParams,
    pol: &Policy,
    cost: u64,
    now: u64,
    retries: u32,
    may_create: impl FnOnce() -> bool,
) -> Take {
    let rpm = p.requests_per_minute.is_some();
    let init = Account {
        last_use_ns: now,
        last_sync_ns: now,
        ..Account::default()
    };
    let Ok(seen) = store.get(key) else {
        return Take::Store;
    };
    if seen.is_none() && !may_create() {
        return Take::Miss(None, false, 0);
    }
    let r = crate::store::update_from(store, key, retries, &init, seen, |a: &Account| {
        let mut n = *a;
        n.last_use_ns = now;
        n.last_cost = cost;
        if a.tokens >= cost && (!rpm || a.requests >= 1) {
            n.tokens -= cost;
            n.consumed = n.consumed.saturating_add(cost);
            if rpm {
                n.requests -= 1;
                n.consumed_requests = n.consumed_requests.saturating_add(1);
            }
            let asking = a.asking_since_ns != 0
                && now.saturating_sub(a.asking_since_ns) < pol.ask_timeout_ns;
            let low = target(&n, p, pol, cost)
                .is_some_and(|(t, r)| n.tokens < t / 2 || (rpm && n.requests < r.div_ceil(2)));
            let refill = low && !asking && n.flags & WANTS_REFILL == 0;
            if refill {
                n.flags |= WANTS_REFILL;
            }
            return (Take::Hit(n, refill), Some(n));
        }
        let asking =
            a.asking_since_ns != 0 && now.saturating_sub(a.asking_since_ns) < pol.ask_timeout_ns;
        // The use since the last measure counts now (a bucket that went quiet asks less).
        measure(&mut n, pol, now);
        let ask = if asking || a.flags & UNLISTED != 0 {
            None
        } else {
            target(&n, p, pol, cost).and_then(|(t, r)| block(&n, t, r, rpm))
        };
        if ask.is_some() {
            n.asking_since_ns = now.max(1);
            n.flags &= !WANTS_REFILL;
        }
        let from = n.tokens.min(cost);
        n.tokens -= from;
        (Take::Miss(ask, false, from), Some(n))
    });
    match r {
        Ok((Take::Miss(ask, _, from), stats)) => Take::Miss(ask, stats.created, from),
        Ok((t, _)) => t,
        Err(_) => Take::Store,
    }
}

/// The block that brings `a` up to (`t`, `r`); `None` when nothing is missing.
fn block(a: &Account, t: u64, r: u64, rpm: bool) -> Option<(u64, u64)> {
    let bt = t.saturating_sub(a.tokens);
    let br = if rpm { r.saturating_sub(a.requests) } else { 0 };
    (bt > 0 || br > 0).then_some((bt, br))
}

/// What Redis said to a charge or block call of this account.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    /// Tokens admitted for a request charged in Redis (0: refused, or a block alone).
    pub admitted_cost: u64,
    /// Requests admitted with it.
    pub admitted_requests: u64,
    /// Block granted.
    pub block_tokens: u64,
    /// Block requests granted.
    pub block_requests: u64,
    /// Redis' balances after the call.
    pub seen: BucketState,
    /// This call carried the account's ask (clears it).
    pub asked: bool,
}

/// Applies an answer from Redis: the block is added (what would exceed the caps is returned, to be
/// credited back to Redis), the use measured, Redis' balances kept for `x-ratelimit-*`.
/// Returns the excess (tokens, requests), or `None` when shared data failed (the whole block is then
/// returned by the caller).
pub fn apply(
    store: &dyn SharedStore,
    key: &str,
    p: &BucketParams,
    pol: &Policy,
    ans: &Answer,
    now: u64,
    retries: u32,
) -> Option<(u64, u64)> {
    let (cap_t, cap_r) = pol.caps(p);
    let rpm = p.requests_per_minute.is_some();
    let seen = store.get(key).ok()?;
    if seen.is_none() {
        // No account (never made, beyond the bound): the whole block goes back.
        return Some((ans.block_tokens, ans.block_requests));
    }
    let r = crate::store::update_from(
        store,
        key,
        retries,
        &Account::default(),
        seen,
        |a: &Account| {
            let mut n = *a;
            if ans.asked {
                n.asking_since_ns = 0;
            }
            n.consumed = n.consumed.saturating_add(ans.admitted_cost);
            n.consumed_requests = n.consumed_requests.saturating_add(ans.admitted_requests);
            measure(&mut n, pol, now);
            let t = n.tokens.saturating_add(ans.block_tokens);
            let keep_t = t.min(cap_t.max(n.tokens));
            let r = if rpm {
                n.requests.saturating_add(ans.block_requests)
            } else {
                0
            };
            let keep_r = if rpm { r.min(cap_r.max(n.requests)) } else { 0 };
            let excess = (
                t - keep_t,
                ans.block_requests.saturating_sub(keep_r - n.requests),
            );
            n.tokens = keep_t;
            n.requests = keep_r;
            if ans.asked {
                backoff(&mut n, p, pol, now);
            }
            n.seen_tokens = ans.seen.tokens;
            n.seen_requests = ans.seen.requests;
            n.seen_ns = now;
            (excess, Some(n))
        },
    );
    r.ok().map(|(x, _)| x)
}

/// After an ask that left the account still low (Redis had little or nothing to give), no new ask
/// until the bucket can have refilled what is missing (at least 100 ms, at most 10 s): the account is
/// marked as asking until then. Without this a spent bucket would be asked every tick.
fn backoff(n: &mut Account, p: &BucketParams, pol: &Policy, now: u64) {
    let Some((t, _)) = target(n, p, pol, n.last_cost) else {
        return;
    };
    if n.tokens >= t / 2 {
        return;
    }
    let missing = (t / 2 - n.tokens) as f64;
    let secs = (missing / p.tokens_per_second).clamp(0.1, 10.0);
    let wait_ns = (secs * 1e9) as u64;
    // An ask counts as in flight for `ask_timeout_ns` after `asking_since_ns`.
    n.asking_since_ns = now
        .saturating_add(wait_ns)
        .saturating_sub(pol.ask_timeout_ns)
        .max(1);
}

/// Updates the use rates from what was consumed since the last measure (an exponential average with a
/// time constant of about one horizon).
fn measure(a: &mut Account, pol: &Policy, now: u64) {
    let elapsed = now.saturating_sub(a.last_sync_ns) as f64 / 1e9;
    if elapsed <= 0.0 {
        return;
    }
    let tau = pol.horizon_s.max(0.5);
    let w = (elapsed / tau).min(1.0);
    let used = a.consumed.saturating_sub(a.synced) as f64;
    let used_r = a.consumed_requests.saturating_sub(a.synced_requests) as f64;
    a.rate = a.rate * (1.0 - w) + used / elapsed * w;
    a.request_rate = a.request_rate * (1.0 - w) + used_r / elapsed * w;
    a.synced = a.consumed;
    a.synced_requests = a.consumed_requests;
    a.last_sync_ns = now;
}

/// An ask that did not get an answer (Redis down, dispatch refused): cleared so a later one can go.
pub fn abandon(store: &dyn SharedStore, key: &str, retries: u32) {
    let _ = crate::store::update(store, key, retries, &Account::default(), |a: &Account| {
        if a.asking_since_ns == 0 {
            return ((), None);
        }
        let mut n = *a;
        n.asking_since_ns = 0;
        ((), Some(n))
    });
}

/// Marks the account at `key` as never leased (the registry is full); clears its ask.
pub fn forbid(store: &dyn SharedStore, key: &str, retries: u32) {
    let _ = crate::store::update(store, key, retries, &Account::default(), |a: &Account| {
        let mut n = *a;
        n.flags |= UNLISTED;
        n.asking_since_ns = 0;
        ((), Some(n))
    });
}

/// What the tick should do for one account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Ask Redis for this block (tokens, requests); the ask is marked in flight.
    TopUp(u64, u64),
    /// The account went idle: these (tokens, requests) were taken out of it, to be credited to Redis.
    GiveBack(u64, u64),
}

/// Decides (and marks, with one CAS) the tick's work for the account at `key`.
pub fn plan(
    store: &dyn SharedStore,
    key: &str,
    p: &BucketParams,
    pol: &Policy,
    now: u64,
    retries: u32,
) -> Option<Plan> {
    let rpm = p.requests_per_minute.is_some();
    let r = crate::store::update(store, key, retries, &Account::default(), |a: &Account| {
        if a.last_use_ns == 0 {
            return (None, None);
        }
        let mut n = *a;
        if now.saturating_sub(a.last_use_ns) > pol.idle_ns {
            if a.tokens == 0 && a.requests == 0 {
                return (None, None);
            }
            n.tokens = 0;
            n.requests = 0;
            n.flags &= !WANTS_REFILL;
            return (Some(Plan::GiveBack(a.tokens, a.requests)), Some(n));
        }
        if a.asking_since_ns != 0 && now.saturating_sub(a.asking_since_ns) < pol.ask_timeout_ns {
            return (None, None);
        }
        let low_at = |x: &Account| {
            target(x, p, pol, x.last_cost)
                .filter(|(t, r)| x.tokens < t / 2 || (rpm && x.requests < r.div_ceil(2)))
        };
        if low_at(a).is_none() && a.flags & WANTS_REFILL == 0 {
            return (None, None);
        }
        // Sized by the use measured up to now.
        measure(&mut n, pol, now);
        n.flags &= !WANTS_REFILL;
        let Some((t, r)) = low_at(&n) else {
            return (None, Some(n));
        };
        match block(&n, t, r, rpm) {
            Some((bt, br)) => {
                n.asking_since_ns = now.max(1);
                (Some(Plan::TopUp(bt, br)), Some(n))
            }
            None => (None, Some(n)),
        }
    });
    r.ok().and_then(|(x, _)| x)
}

/// Puts `amount` tokens a request gave back into the account at `key` (never above the cap); returns
/// what did not fit (to be credited to Redis). An account that does not exist takes nothing.
pub fn credit(
    store: &dyn SharedStore,
    key: &str,
    p: &BucketParams,
    pol: &Policy,
    amount: u64,
    retries: u32,
) -> u64 {
    let (cap_t, _) = pol.caps(p);
    if !matches!(crate::store::peek::<Account>(store, key), Ok((Some(_), _))) {
        return amount;
    }
    let r = crate::store::update(store, key, retries, &Account::default(), |a: &Account| {
        let room = if a.flags & UNLISTED != 0 {
            0
        } else {
            cap_t.saturating_sub(a.tokens)
        };
        let put = room.min(amount);
        if put == 0 {
            return (amount, None);
        }
        let mut n = *a;
        n.tokens += put;
        (amount - put, Some(n))
    });
    r.map_or(amount, |(rest, _)| rest)
}

/// Takes `amount` tokens (usage above the charge) out of the account at `key` as far as it holds them;
/// returns what it could not cover (to be debited in Redis).
pub fn debit(store: &dyn SharedStore, key: &str, amount: u64, retries: u32) -> u64 {
    if !matches!(crate::store::peek::<Account>(store, key), Ok((Some(_), _))) {
        return amount;
    }
    let r = crate::store::update(store, key, retries, &Account::default(), |a: &Account| {
        let take = a.tokens.min(amount);
        if take == 0 {
            return (amount, None);
        }
        let mut n = *a;
        n.tokens -= take;
        (amount - take, Some(n))
    });
    r.map_or(amount, |(rest, _)| rest)
}

/// True when the account at `key` holds `cost` tokens (and a request): a refusal cached from Redis
/// does not apply to this Envoy then.
pub fn covers(store: &dyn SharedStore, key: &str, p: &BucketParams, cost: u64) -> bool {
    match crate::store::peek::<Account>(store, key) {
        Ok((Some(a), _)) => {
            a.tokens >= cost && (p.requests_per_minute.is_none() || a.requests >= 1)
        }
        _ => false,
    }
}

/// `x-ratelimit-*` of a request admitted from the lease: Redis' balance as last reported (refilled
/// since) plus what this Envoy holds, at most the burst.
pub fn snapshot(a: &Account, p: &BucketParams, now: u64) -> Snapshot {
    let seen = BucketState {
        tokens: a.seen_tokens,
        requests: a.seen_requests,
        updated_ns: if a.seen_ns == 0 { now } else { a.seen_ns },
    }
    .refilled(p, now);
    let s = BucketState {
        tokens: (seen.tokens + a.tokens as f64).min(p.burst),
        requests: (seen.requests + a.requests as f64).min(p.requests_per_minute.unwrap_or(0.0)),
        updated_ns: now,
    };
    s.snapshot(p)
}

/// The account key of a bucket (its Redis key).
pub fn account_key(redis_key: &str) -> String {
    let mut k = String::with_capacity(ACCOUNT.len() + redis_key.len());
    k.push_str(ACCOUNT);
    k.push_str(redis_key);
    k
}

/// The registry entry of a bucket: `<rule index>\n<rule name>\n<redis key>`.
pub fn entry(rule: usize, name: &str, redis_key: &str) -> String {
    format!("{rule}\n{name}\n{redis_key}")
}

/// Reads a registry entry back: (rule index, rule name, redis key).
pub fn parse_entry(s: &str) -> Option<(usize, &str, &str)> {
    let mut it = s.splitn(3, '\n');
    let idx = it.next()?.parse().ok()?;
    Some((idx, it.next()?, it.next()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    const S: u64 = 1_000_000_000;

    fn params(rpm: Option<f64>) -> BucketParams {
        BucketParams {
            tokens_per_second: 1000.0,
            burst: 100_000.0,
            requests_per_minute: rpm,
        }
    }

    fn pol() -> Policy {
        Policy {
            horizon_s: 1.0,
            max_share: 0.1,
            idle_ns: 2 * S,
            ask_timeout_ns: S,
        }
    }

    fn answer(cost: u64, bt: u64, br: u64, asked: bool) -> Answer {
        Answer {
            admitted_cost: cost,
            admitted_requests: u64::from(cost > 0),
            block_tokens: bt,
            block_requests: br,
            seen: BucketState {
                tokens: 50_000.0,
                requests: 0.0,
                updated_ns: 0,
            },
            asked,
        }
    }

    fn account(s: &MemStore, k: &str) -> Account {
        crate::store::peek::<Account>(s, k).unwrap().0.unwrap()
    }

    #[test]
    fn an_account_round_trips_its_encoding_and_refuses_garbage() {
        let a = Account {
            tokens: 1,
            requests: 2,
            consumed: 3,
            consumed_requests: 4,
            synced: 5,
            synced_requests: 6,
            rate: 7.5,
            request_rate: 8.25,
            last_sync_ns: 9,
            last_use_ns: 10,
            asking_since_ns: 11,
            seen_tokens: -12.5,
            seen_requests: 13.0,
            seen_ns: 14,
            last_cost: 15,
            flags: 1,
        };
        assert_eq!(Account::decode(&a.encode()), Some(a));
        assert_eq!(Account::decode(&a.encode()[1..]), None);
        let mut nan = a;
        nan.rate = f64::NAN;
        assert_eq!(Account::decode(&nan.encode()), None);
    }

    #[test]
    fn a_slow_bucket_is_never_leased_and_a_busy_one_gets_rate_times_horizon_capped_at_the_share() {
        let p = params(None);
        let mut a = Account::default();
        // Nothing measured: below one request's use within the horizon.
        assert_eq!(target(&a, &p, &pol(), 200), None);
        a.rate = 150.0;
        assert_eq!(target(&a, &p, &pol(), 200), None, "less than one request");
        a.rate = 3000.0;
        assert_eq!(target(&a, &p, &pol(), 200), Some((3000, 0)));
        a.rate = 1e9;
        assert_eq!(
            target(&a, &p, &pol(), 200),
            Some((10_000, 0)),
            "10 % of the burst"
        );
        // One request costs more than the share: no lease.
        assert_eq!(target(&a, &p, &pol(), 20_000), None);
        // Requests/minute: the block covers the request rate too, capped at 10 % of it.
        let p = params(Some(600.0));
        a.request_rate = 30.0;
        assert_eq!(target(&a, &p, &pol(), 200), Some((10_000, 30)));
        a.request_rate = 1000.0;
        assert_eq!(target(&a, &p, &pol(), 200), Some((10_000, 60)));
        let p = params(Some(5.0));
        assert_eq!(
            target(&a, &p, &pol(), 200),
            None,
            "10 % of 5/min is no request"
        );
    }

    #[test]
    fn requests_spend_exactly_what_redis_granted_and_miss_beyond_it() {
        let s = MemStore::new();
        let p = params(None);
        let k = account_key("tg:gb:{g:acme}");
        // Cold: a miss that asks nothing (no rate yet); the account was created.
        assert_eq!(
            take(&s, &k, &p, &pol(), 100, S, 8, || true),
            Take::Miss(None, true, 0)
        );
        // Redis admitted the request per request; a second later the rate shows 100/s.
        apply(&s, &k, &p, &pol(), &answer(100, 0, 0, false), 2 * S, 8).unwrap();
        let a = account(&s, &k);
        assert!((a.rate - 100.0).abs() < 1e-9, "{}", a.rate);
        // Busy now: 5000 tokens in the second before the next miss.
        let mut a = account(&s, &k);
        a.consumed += 5000;
        s.set(&k, &a.encode(), 0).unwrap();
        apply(&s, &k, &p, &pol(), &answer(0, 0, 0, false), 3 * S, 8).unwrap();
        let Take::Miss(Some((bt, 0)), false, 0) = take(&s, &k, &p, &pol(), 100, 3 * S, 8, || true)
        else {
            panic!("a block is asked");
        };
        assert_eq!(bt, 5000);
        // One ask at a time: a concurrent miss asks nothing.
        assert_eq!(
            take(&s, &k, &p, &pol(), 100, 3 * S, 8, || true),
            Take::Miss(None, false, 0)
        );
        // Redis granted 300 tokens beyond the request (all it had).
        assert_eq!(
            apply(&s, &k, &p, &pol(), &answer(100, 300, 0, true), 3 * S, 8),
            Some((0, 0))
        );
        for _ in 0..3 {
            assert!(matches!(
                take(&s, &k, &p, &pol(), 100, 3 * S, 8, || true),
                Take::Hit(..)
            ));
        }
        // Spent; Redis gave only 300 of the 5000 asked: no new ask until the bucket can have
        // refilled what is missing (the request itself is charged in Redis).
        assert!(matches!(
            take(&s, &k, &p, &pol(), 100, 3 * S, 8, || true),
            Take::Miss(None, false, 0)
        ));
        assert!(matches!(
            take(&s, &k, &p, &pol(), 100, 6 * S, 8, || true),
            Take::Miss(Some(_), false, 0)
        ));
        assert_eq!(account(&s, &k).tokens, 0);
    }

    #[test]
    fn an_account_never_holds_more_than_its_cap_and_returns_the_excess() {
        let s = MemStore::new();
        let p = params(Some(600.0));
        let k = account_key("b");
        take(&s, &k, &p, &pol(), 100, S, 8, || true);
        assert_eq!(
            apply(&s, &k, &p, &pol(), &answer(0, 9_000, 50, false), S, 8),
            Some((0, 0))
        );
        // A late grant on top: beyond 10 % of the burst (10,000) and of rpm (60) goes back.
        assert_eq!(
            apply(&s, &k, &p, &pol(), &answer(0, 4_000, 40, false), S, 8),
            Some((3_000, 30))
        );
        let a = account(&s, &k);
        assert_eq!((a.tokens, a.requests), (10_000, 60));
        // Credits fill up to the cap; the rest is for Redis. Debits take what the account holds.
        assert_eq!(credit(&s, &k, &p, &pol(), 500, 8), 500);
        assert_eq!(debit(&s, &k, 700, 8), 0);
        assert_eq!(credit(&s, &k, &p, &pol(), 1000, 8), 300);
        assert_eq!(debit(&s, &k, 20_000, 8), 10_000);
        // An account the leader does not walk takes no credit (it could not be given back).
        let k2 = account_key("c");
        take(&s, &k2, &p, &pol(), 100, S, 8, || true);
        forbid(&s, &k2, 8);
        assert_eq!(credit(&s, &k2, &p, &pol(), 5, 8), 5);
        // No account: everything goes to Redis.
        assert_eq!(credit(&s, "nope", &p, &pol(), 5, 8), 5);
        assert_eq!(debit(&s, "nope", 5, 8), 5);
    }

    #[test]
    fn the_tick_tops_up_a_low_account_and_gives_an_idle_one_back() {
        let s = MemStore::new();
        let p = params(None);
        let k = account_key("b");
        take(&s, &k, &p, &pol(), 100, S, 8, || true);
        let mut a = account(&s, &k);
        a.rate = 4000.0;
        a.tokens = 3000;
        s.set(&k, &a.encode(), 0).unwrap();
        // 3000 of a 4000 block: not low yet.
        assert_eq!(plan(&s, &k, &p, &pol(), S, 8), None);
        // Spending below half a block asks for a top-up, once.
        let mut refills = 0;
        for _ in 0..15 {
            if let Take::Hit(_, true) = take(&s, &k, &p, &pol(), 100, S, 8, || true) {
                refills += 1;
            }
        }
        assert_eq!(refills, 1);
        assert_eq!(plan(&s, &k, &p, &pol(), S, 8), Some(Plan::TopUp(2500, 0)));
        assert_eq!(plan(&s, &k, &p, &pol(), S, 8), None, "in flight");
        apply(&s, &k, &p, &pol(), &answer(0, 2500, 0, true), S + 1, 8);
        // Idle: given back whole, then nothing more to do.
        assert_eq!(
            plan(&s, &k, &p, &pol(), 4 * S, 8),
            Some(Plan::GiveBack(4000, 0))
        );
        assert_eq!(plan(&s, &k, &p, &pol(), 4 * S, 8), None);
        assert_eq!(account(&s, &k).tokens, 0);
        // A failed ask is cleared.
        let mut a = account(&s, &k);
        a.asking_since_ns = 5 * S;
        s.set(&k, &a.encode(), 0).unwrap();
        abandon(&s, &k, 8);
        assert_eq!(account(&s, &k).asking_since_ns, 0);
    }

    #[test]
    fn an_ask_that_got_little_waits_for_the_bucket_to_refill_before_the_next() {
        let s = MemStore::new();
        let p = params(None);
        let pol = Policy {
            idle_ns: 60 * S,
            ..pol()
        };
        let k = account_key("b");
        take(&s, &k, &p, &pol, 100, S, 8, || true);
        let mut a = account(&s, &k);
        a.rate = 4000.0;
        a.tokens = 100;
        s.set(&k, &a.encode(), 0).unwrap();
        let Some(Plan::TopUp(..)) = plan(&s, &k, &p, &pol, S, 8) else {
            panic!("a low account asks");
        };
        // Redis had nothing to give: half the target (2000) is missing, 1.9 s at 1000 tokens/s.
        apply(&s, &k, &p, &pol, &answer(0, 0, 0, true), S, 8).unwrap();
        // Still busy (requests charged per request keep the measured use up).
        let busy = |s: &MemStore, at: u64| {
            let mut a = account(s, &k);
            a.consumed += 4000;
            a.last_use_ns = at;
            s.set(&k, &a.encode(), 0).unwrap();
        };
        busy(&s, 2 * S);
        assert_eq!(
            plan(&s, &k, &p, &pol, 2 * S, 8),
            None,
            "not asked again at once"
        );
        busy(&s, 3 * S);
        assert!(matches!(
            plan(&s, &k, &p, &pol, 3 * S, 8),
            Some(Plan::TopUp(..))
        ));
    }

    #[test]
    fn a_miss_takes_what_the_account_holds_toward_the_cost() {
        let s = MemStore::new();
        let p = params(None);
        let k = account_key("b");
        take(&s, &k, &p, &pol(), 100, S, 8, || true);
        let mut a = account(&s, &k);
        a.tokens = 60;
        s.set(&k, &a.encode(), 0).unwrap();
        // 60 held, 100 asked: the 60 go with the request (Redis is charged 40), the account is empty.
        assert!(matches!(
            take(&s, &k, &p, &pol(), 100, S, 8, || true),
            Take::Miss(_, false, 60)
        ));
        assert_eq!(account(&s, &k).tokens, 0);
    }

    #[test]
    fn a_bucket_that_went_quiet_asks_for_no_block() {
        let s = MemStore::new();
        let p = params(None);
        let k = account_key("b");
        take(&s, &k, &p, &pol(), 100, S, 8, || true);
        let mut a = account(&s, &k);
        a.rate = 4000.0;
        s.set(&k, &a.encode(), 0).unwrap();
        assert!(matches!(
            take(&s, &k, &p, &pol(), 100, S, 8, || true),
            Take::Miss(Some(_), _, _)
        ));
        abandon(&s, &k, 8);
        // Ten quiet seconds later the measured use is nil: a miss is charged on its own.
        assert_eq!(
            take(&s, &k, &p, &pol(), 100, 11 * S, 8, || true),
            Take::Miss(None, false, 0)
        );
        assert!(account(&s, &k).rate < 1.0);
    }

    #[test]
    fn no_account_is_made_beyond_the_bound_and_a_block_without_one_goes_back() {
        let s = MemStore::new();
        let p = params(None);
        let k = account_key("b");
        assert_eq!(
            take(&s, &k, &p, &pol(), 100, S, 8, || false),
            Take::Miss(None, false, 0)
        );
        assert!(s.is_empty(), "no key made");
        assert_eq!(
            apply(&s, &k, &p, &pol(), &answer(100, 300, 2, true), S, 8),
            Some((300, 2))
        );
        assert!(s.is_empty());
    }

    #[test]
    fn registry_entries_round_trip_and_are_bounded() {
        let s = MemStore::new();
        let e = entry(3, "g", "tg:gb:{g:a}");
        assert_eq!(parse_entry(&e), Some((3, "g", "tg:gb:{g:a}")));
        assert!(REGISTRY.register(&s, &e, 1, 8));
        assert!(!REGISTRY.register(&s, "x", 1, 8));
        assert_eq!(REGISTRY.registered(&s), 1);
        assert_eq!(REGISTRY.slot(&s, 0).as_deref(), Some(e.as_str()));
    }
}
