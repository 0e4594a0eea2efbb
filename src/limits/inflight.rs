//! Requests in flight (`limits[].max_in_flight`): a counting semaphore per limit and subject in this
//! Envoy's shared data, exact across its workers.
//!
//! The value at `tg:if:<limit>:<subject>` lists the slots held: one `(owner, expires_ns)` pair per
//! request in flight. A request takes a slot when admitted and gives it back when its stream ends (the
//! response ended, the client went, a later step refused it), through a CAS like every shared-data
//! write. A slot whose request vanished without giving it back (a VM that crashed) expires
//! `ttl` after it was taken, so none leaks for good; a request that lasts longer than `ttl` stops
//! counting from then on (the documented bound: at most one extra request in flight per such request).

use crate::store::{self, Codec, SharedStore, UpdateError};

/// How long a slot is held at most (seconds), unless given back first.
pub const SLOT_TTL_S: u64 = 900;

/// The slots of one semaphore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slots(pub Vec<(u64, u64)>);

const VERSION: u8 = 1;

impl Codec for Slots {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 16 * self.0.len());
        out.push(VERSION);
        for (owner, exp) in &self.0 {
            out.extend_from_slice(&owner.to_le_bytes());
            out.extend_from_slice(&exp.to_le_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let (v, rest) = bytes.split_first()?;
        if *v != VERSION || rest.len() % 16 != 0 {
            return None;
        }
        let mut slots = Vec::with_capacity(rest.len() / 16);
        for pair in rest.chunks_exact(16) {
            slots.push((store::read_u64(pair, 0)?, store::read_u64(pair, 8)?));
        }
        Some(Slots(slots))
    }
}

impl Slots {
    /// Slots still held at `now_ns`.
    pub fn live(&self, now_ns: u64) -> usize {
        self.0.iter().filter(|(_, exp)| *exp > now_ns).count()
    }
}

/// What [`acquire`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// A slot was taken; `in_flight` counts it.
    Taken {
        /// Requests in flight, this one included.
        in_flight: usize,
    },
    /// Every slot is held: nothing was taken.
    Full,
}

/// Takes one of `max` slots at `key` for `owner` (expiring at `now_ns + ttl_ns`), dropping expired ones.
/// The corrupt-value flag is returned with the decision (the value is then treated as empty).
pub fn acquire(
    s: &dyn SharedStore,
    key: &str,
    max: u32,
    owner: u64,
    now_ns: u64,
    ttl_ns: u64,
    retries: u32,
) -> Result<(Acquired, bool), UpdateError> {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let exp = now_ns.saturating_add(ttl_ns);
    store::update(s, key, retries, &Slots::default(), |cur| {
        let mut next: Vec<(u64, u64)> =
            cur.0.iter().copied().filter(|(_, e)| *e > now_ns).collect();
        if next.len() >= max {
            // Write only to drop expired slots.
            let write = (next.len() != cur.0.len()).then_some(Slots(next));
            return (Acquired::Full, write);
        }
        next.push((owner, exp));
        let n = next.len();
        (Acquired::Taken { in_flight: n }, Some(Slots(next)))
    })
    .map(|(a, stats)| (a, stats.corrupt))
}

/// Gives back the slot `owner` took at `key` (one of them, should two owners be equal: either is the
/// same slot to the count). `Ok(false)`: none was found (it had expired).
pub fn release(
    s: &dyn SharedStore,
    key: &str,
    owner: u64,
    retries: u32,
) -> Result<bool, UpdateError> {
    store::update(s, key, retries, &Slots::default(), |cur| {
        match cur.0.iter().position(|(o, _)| *o == owner) {
            Some(i) => {
                let mut next = cur.0.clone();
                next.remove(i);
                (true, Some(Slots(next)))
            }
            None => (false, None),
        }
    })
    .map(|(found, _)| found)
}

/// Requests in flight at `key` now (read only; a missing or corrupt value counts none).
pub fn in_flight(s: &dyn SharedStore, key: &str, now_ns: u64) -> Result<usize, store::StoreError> {
    Ok(store::peek::<Slots>(s, key)?
        .0
        .map_or(0, |slots| slots.live(now_ns)))
}

/// An owner id for a request: its context id and the time it was admitted (unique within a worker;
/// across workers a tie would only make two slots interchangeable, which they are).
pub fn owner(context_id: u32, now_ns: u64) -> u64 {
    now_ns.rotate_left(20) ^ u64::from(context_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    const TTL: u64 = 1_000_000_000;

    #[test]
    fn slots_are_taken_up_to_max_and_given_back() {
        let s = MemStore::new();
        assert_eq!(
            acquire(&s, "k", 2, 1, 10, TTL, 8).unwrap().0,
            Acquired::Taken { in_flight: 1 }
        );
        assert_eq!(
            acquire(&s, "k", 2, 2, 11, TTL, 8).unwrap().0,
            Acquired::Taken { in_flight: 2 }
        );
        assert_eq!(
            acquire(&s, "k", 2, 3, 12, TTL, 8).unwrap().0,
            Acquired::Full
        );
        assert!(release(&s, "k", 1, 8).unwrap());
        assert!(!release(&s, "k", 1, 8).unwrap(), "given back once only");
        assert_eq!(in_flight(&s, "k", 13).unwrap(), 1);
        assert_eq!(
            acquire(&s, "k", 2, 3, 13, TTL, 8).unwrap().0,
            Acquired::Taken { in_flight: 2 }
        );
    }

    #[test]
    fn a_vanished_request_slot_expires() {
        let s = MemStore::new();
        acquire(&s, "k", 1, 1, 0, TTL, 8).unwrap();
        assert_eq!(
            acquire(&s, "k", 1, 2, TTL - 1, TTL, 8).unwrap().0,
            Acquired::Full
        );
        assert_eq!(
            acquire(&s, "k", 1, 2, TTL, TTL, 8).unwrap().0,
            Acquired::Taken { in_flight: 1 }
        );
        assert_eq!(in_flight(&s, "k", TTL).unwrap(), 1);
    }

    #[test]
    fn corrupt_values_read_as_empty() {
        let s = MemStore::new();
        s.set("k", b"\x07junk", 0).unwrap();
        let (a, corrupt) = acquire(&s, "k", 1, 1, 0, TTL, 8).unwrap();
        assert_eq!(a, Acquired::Taken { in_flight: 1 });
        assert!(corrupt);
        assert_eq!(
            Slots::decode(&Slots(vec![(1, 2)]).encode()),
            Some(Slots(vec![(1, 2)]))
        );
        assert_eq!(Slots::decode(&[1, 0, 0]), None);
    }
}
