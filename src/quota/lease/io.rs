//! The provider's input and output tokens of this Envoy's leased requests, per lease account, in shared
//! data beside the account (the account record keeps the layout 0.1.0 reads; see `docs/upgrading.md`):
//!
//! ```text
//! tg:la:<tenant>|<model>|io   [v=1][month u32][in u64][out u64][prev month u32][in u64][out u64]
//! ```
//! * `in`/`out` are cumulative totals of the month (the usage's prompt and completion tokens of the
//!   account's leased requests that ended on this Envoy), written by each VM at its tick ([`add`]) with
//!   the ended requests it kept; a sync reports the month's totals with the lease's weighted total
//!   ([`totals`]) and the lease script adds to the month's `:io` hash only what exceeds the totals it
//!   holds for the lease (a resent or repeated sync counts nothing twice).
//! * The previous month is kept beside the current one: what ended in the last days of a month is still
//!   reported by the sync that gives that month's lease back, after requests of the new month began.
//! * The record's key ends with `|io`: a sanitized tenant or model never holds a raw `|`, so no account
//!   key (`tg:la:<tenant>|<model>`, one raw `|`) is ever an io key. One per account: bounded by
//!   `max_tenants` like the accounts.

use crate::store::{read_u32, read_u64, Codec, SharedStore};

/// One month's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Month {
    /// `YYYYMM` (0: none).
    pub month: u32,
    /// Input tokens.
    pub tokens_in: u64,
    /// Output tokens.
    pub tokens_out: u64,
}

/// An account's io record: this month's totals and the previous month's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Io {
    /// The latest month written.
    pub cur: Month,
    /// The month before it (0: none).
    pub prev: Month,
}

const LEN: usize = 1 + 2 * (4 + 8 + 8);

impl Codec for Io {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LEN);
        v.push(1);
        for m in [self.cur, self.prev] {
            v.extend_from_slice(&m.month.to_le_bytes());
            v.extend_from_slice(&m.tokens_in.to_le_bytes());
            v.extend_from_slice(&m.tokens_out.to_le_bytes());
        }
        v
    }

    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != LEN || b.first() != Some(&1) {
            return None;
        }
        let m = |at: usize| -> Option<Month> {
            Some(Month {
                month: read_u32(b, at)?,
                tokens_in: read_u64(b, at + 4)?,
                tokens_out: read_u64(b, at + 12)?,
            })
        };
        Some(Io {
            cur: m(1)?,
            prev: m(21)?,
        })
    }
}

impl Io {
    /// The month's totals (`(0, 0)` for a month the record does not hold).
    pub fn get(&self, month: u32) -> (u64, u64) {
        [self.cur, self.prev]
            .into_iter()
            .find(|m| m.month == month && month != 0)
            .map_or((0, 0), |m| (m.tokens_in, m.tokens_out))
    }

    fn slot(&mut self, month: u32) -> Option<&mut Month> {
        if self.cur.month == month {
            return Some(&mut self.cur);
        }
        if self.prev.month == month {
            return Some(&mut self.prev);
        }
        None
    }

    /// Adds to `month`'s totals: a month after the current one becomes current (the current one
    /// previous, the previous one forgotten: its lease was given back before a request of the month
    /// after could end, see [`Io`]). False when `month` is older than both (nothing added).
    pub fn add(&mut self, month: u32, tokens_in: u64, tokens_out: u64) -> bool {
        if month == 0 {
            return false;
        }
        if self.slot(month).is_none() {
            if month < self.cur.month {
                return false;
            }
            self.prev = self.cur;
            self.cur = Month {
                month,
                ..Month::default()
            };
        }
        let Some(m) = self.slot(month) else {
            return false;
        };
        m.tokens_in = m.tokens_in.saturating_add(tokens_in);
        m.tokens_out = m.tokens_out.saturating_add(tokens_out);
        true
    }

    /// A sync of `month` answered that Redis holds `redis` (in, out) for the lease. Where Redis holds
    /// more than this record's total, the record lost what it had reported (a corrupt record read as
    /// fresh, a month forgotten): since everything the record ever sent is at most its total, none of
    /// what it counted since was taken, and its total is raised by Redis' so that the next sync adds
    /// exactly that. True when a total was raised.
    pub fn behind(&mut self, month: u32, redis: (u64, u64)) -> bool {
        if month == 0 || redis == (0, 0) {
            return false;
        }
        // A month the record does not hold (a newer one) starts from Redis' totals.
        if self.slot(month).is_none() && !self.add(month, 0, 0) {
            return false;
        }
        let Some(m) = self.slot(month) else {
            return false;
        };
        let mut raised = false;
        for (local, r) in [(&mut m.tokens_in, redis.0), (&mut m.tokens_out, redis.1)] {
            if r > *local {
                *local = local.saturating_add(r);
                raised = true;
            }
        }
        raised
    }
}

/// The io record's key of the account at `account_key`.
pub fn io_key(account_key: &str) -> String {
    let mut k = String::with_capacity(account_key.len() + 3);
    k.push_str(account_key);
    k.push_str("|io");
    k
}

/// Adds ended leased requests' tokens to the record at `key` (one CAS). False when the store failed
/// (nothing written: to add again later).
pub fn add(
    store: &dyn SharedStore,
    key: &str,
    month: u32,
    tokens_in: u64,
    tokens_out: u64,
    retries: u32,
) -> bool {
    crate::store::update(store, key, retries, &Io::default(), |r: &Io| {
        let mut n = *r;
        let changed = n.add(month, tokens_in, tokens_out);
        ((), changed.then_some(n))
    })
    .is_ok()
}

/// The month's totals in the record at `key` (`(0, 0)` when there is none, or it is corrupt: the
/// lease script then adds nothing, and its answer raises the record, [`synced`]).
pub fn totals(store: &dyn SharedStore, key: &str, month: u32) -> (u64, u64) {
    crate::store::peek::<Io>(store, key)
        .ok()
        .and_then(|(r, _)| r)
        .map_or((0, 0), |r| r.get(month))
}

/// A sync of `month` answered Redis' totals `redis` for the lease, where `sent` was reported: when
/// Redis holds more than was sent, the record is raised as [`Io::behind`] says (one CAS, only then).
/// True when it was.
pub fn synced(
    store: &dyn SharedStore,
    key: &str,
    month: u32,
    sent: (u64, u64),
    redis: (u64, u64),
    retries: u32,
) -> bool {
    if redis.0 <= sent.0 && redis.1 <= sent.1 {
        // The record holds at least what it sent: Redis is not ahead of it.
        return false;
    }
    crate::store::update(store, key, retries, &Io::default(), |r: &Io| {
        let mut n = *r;
        let raised = n.behind(month, redis);
        (raised, raised.then_some(n))
    })
    .map(|(x, _)| x)
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn the_record_round_trips_and_a_wrong_length_or_version_is_corrupt() {
        let r = Io {
            cur: Month {
                month: 202612,
                tokens_in: 7,
                tokens_out: u64::MAX,
            },
            prev: Month {
                month: 202611,
                tokens_in: 1,
                tokens_out: 2,
            },
        };
        let b = r.encode();
        assert_eq!(b.len(), 41);
        assert_eq!(Io::decode(&b), Some(r));
        assert_eq!(Io::decode(&b[..40]), None);
        let mut v2 = b.clone();
        v2[0] = 2;
        assert_eq!(Io::decode(&v2), None);
        // An account record (94 bytes) is never read as one.
        let a = crate::quota::lease::account::Account::default().encode();
        assert_eq!(Io::decode(&a), None);
    }

    #[test]
    fn no_account_key_is_an_io_key() {
        use crate::quota::lease::account::account_key;
        let k = account_key("acme", Some("m"));
        assert_eq!(io_key(&k), "tg:la:acme|m|io");
        // A model that tries to spell one is escaped.
        assert_eq!(account_key("acme", Some("m|io")), "tg:la:acme|m%7Cio");
        assert_ne!(account_key("acme|m", Some("io")), io_key(&k));
    }

    #[test]
    fn a_new_month_becomes_current_and_keeps_the_previous_one() {
        let mut r = Io::default();
        assert!(r.add(202611, 10, 20));
        assert!(r.add(202611, 1, 2));
        assert!(r.add(202612, 5, 6));
        assert_eq!(r.get(202611), (11, 22));
        assert_eq!(r.get(202612), (5, 6));
        // Last month's requests still end after this month's began.
        assert!(r.add(202611, 1, 1));
        assert_eq!(r.get(202611), (12, 23));
        // Older than both: nothing.
        assert!(!r.add(202610, 1, 1));
        assert_eq!(r.get(202610), (0, 0));
        assert!(r.add(202701, 3, 3));
        assert_eq!((r.get(202611), r.get(202612)), ((0, 0), (5, 6)));
        assert!(!r.add(0, 1, 1));
        assert_eq!(r.get(0), (0, 0));
    }

    #[test]
    fn a_record_behind_redis_is_raised_so_the_next_report_adds_what_it_counted_since() {
        // Redis holds 1000/400 for the lease; the record was lost and counted 50/20 since.
        let mut r = Io::default();
        r.add(202611, 50, 20);
        assert!(r.behind(202611, (1000, 400)));
        assert_eq!(r.get(202611), (1050, 420));
        // Applied twice (a stale answer, another sync's answer): nothing more.
        assert!(!r.behind(202611, (1000, 400)));
        assert_eq!(r.get(202611), (1050, 420));
        // Redis at or below the record: nothing.
        assert!(!r.behind(202611, (1050, 0)));
        // A month the record lost entirely starts from Redis'.
        let mut e = Io::default();
        assert!(e.behind(202611, (9, 0)));
        assert_eq!(e.get(202611), (9, 0));
        assert!(!e.behind(202611, (0, 0)));
    }

    #[test]
    fn adds_and_answers_go_through_the_store() {
        let s = MemStore::default();
        let k = io_key("tg:la:t|-");
        assert_eq!(totals(&s, &k, 202611), (0, 0));
        assert!(add(&s, &k, 202611, 3, 4, 8));
        assert!(add(&s, &k, 202611, 3, 4, 8));
        assert_eq!(totals(&s, &k, 202611), (6, 8));
        // Redis not ahead of what was sent: no write.
        let reads = s.reads();
        assert!(!synced(&s, &k, 202611, (6, 8), (6, 8), 8));
        assert_eq!(s.reads(), reads);
        // Redis ahead (the record was lost): raised once.
        s.set(&k, b"garbage", 0).unwrap();
        assert_eq!(totals(&s, &k, 202611), (0, 0));
        assert!(add(&s, &k, 202611, 2, 1, 8));
        assert!(synced(&s, &k, 202611, (0, 0), (6, 8), 8));
        assert_eq!(totals(&s, &k, 202611), (8, 9));
    }
}
