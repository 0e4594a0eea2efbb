//! A bounded FIFO of byte entries in Envoy's shared data, written by any worker and sent by one: the
//! quota's settlements (and the charges of requests admitted while the shim was down) wait here instead
//! of in one VM's memory, so a VM that goes away (a reload) loses none of them, and whichever VM holds
//! the *claim* sends them.
//!
//! ```text
//! tg:j:m        [v=1][head u64][tail u64]                 entries head..tail are queued
//! tg:j:s:<n>    [v=1][seq u64][payload…]                  slot n = seq mod CAPACITY
//! tg:j:c        [v=1][owner u64][until_ns u64]            who sends, and until when (renewed)
//! tg:n:vms      a count: each VM takes a number from it (its owner id)
//! ```
//!
//! * **Push** (any worker): one CAS on the meta claims `seq = tail` (refused when `tail − head` is
//!   [`CAPACITY`]: the entry is dropped and counted by the caller), then the slot is written with its seq.
//! * **Send** (the claim holder only): reads entries from `head` in order and stops at a slot whose seq is
//!   not the expected one yet (a push between its two writes); once Redis took them, one CAS moves `head`
//!   past them. A claim not renewed for [`CLAIM_NS`](crate::store::claim::CLAIM_NS) passes to the next VM that asks, which sends the
//!   same entries again: the consumers of this journal must be idempotent (the quota's settle script is).
//! * The meta key is created before traffic ([`init`], at configuration) so that two workers cannot both
//!   "create" it: Envoy ignores the CAS of a write to a missing key.
//!
//! Cost of a push: one shared-data read and two writes.

#[cfg(test)]
use crate::store::claim::{owner_id, CLAIM_NS};
use crate::store::{read_u64, SharedStore, StoreError};

/// Entries kept at most; a push beyond is refused.
pub const CAPACITY: u64 = 4096;
/// The meta key.
pub const META: &str = "tg:j:m";
/// The slot key prefix.
pub const SLOT: &str = "tg:j:s:";
/// The claim key.
pub const CLAIM: &str = "tg:j:c";

/// Why a push failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// [`CAPACITY`] entries are queued.
    Full,
    /// Every CAS retry lost, or the host refused a call: try again later.
    Busy,
}

fn meta_bytes(head: u64, tail: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(17);
    v.push(1);
    v.extend_from_slice(&head.to_le_bytes());
    v.extend_from_slice(&tail.to_le_bytes());
    v
}

fn read_meta(store: &dyn SharedStore) -> Result<Option<(u64, u64, u32)>, StoreError> {
    let Some((b, cas)) = store.get(META)? else {
        return Ok(None);
    };
    if b.len() != 17 || b.first() != Some(&1) {
        // Corrupt: treated as empty (the slots are not trusted either).
        return Ok(Some((0, 0, cas)));
    }
    match (read_u64(&b, 1), read_u64(&b, 9)) {
        (Some(h), Some(t)) if h <= t => Ok(Some((h, t, cas))),
        _ => Ok(Some((0, 0, cas))),
    }
}

/// Creates the meta key if it does not exist (call before traffic, e.g. at configuration).
pub fn init(store: &dyn SharedStore) -> Result<(), StoreError> {
    if read_meta(store)?.is_none() {
        store.set(META, &meta_bytes(0, 0), 0)?;
    }
    Ok(())
}

/// `(head, tail)`: what is queued (0, 0 when the journal was never used).
pub fn bounds(store: &dyn SharedStore) -> (u64, u64) {
    match read_meta(store) {
        Ok(Some((h, t, _))) => (h, t),
        _ => (0, 0),
    }
}

fn slot_key(seq: u64) -> String {
    let mut k = String::with_capacity(SLOT.len() + 4);
    k.push_str(SLOT);
    k.push_str(crate::reply::Dec::int(seq % CAPACITY).as_str());
    k
}

/// Appends `payload`; returns its sequence number.
pub fn push(store: &dyn SharedStore, payload: &[u8], retries: u32) -> Result<u64, PushError> {
    for _ in 0..=retries {
        let (head, tail, cas) = match read_meta(store) {
            Ok(Some(m)) => m,
            // A missing meta is created first (its create race is the one `init` avoids at start).
            Ok(None) => {
                init(store).map_err(|_| PushError::Busy)?;
                continue;
            }
            Err(_) => return Err(PushError::Busy),
        };
        if tail.saturating_sub(head) >= CAPACITY {
            return Err(PushError::Full);
        }
        match store.set(META, &meta_bytes(head, tail.saturating_add(1)), cas) {
            Ok(()) => {
                let mut v = Vec::with_capacity(9 + payload.len());
                v.push(1);
                v.extend_from_slice(&tail.to_le_bytes());
                v.extend_from_slice(payload);
                store
                    .set(&slot_key(tail), &v, 0)
                    .map_err(|_| PushError::Busy)?;
                return Ok(tail);
            }
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Host) => return Err(PushError::Busy),
        }
    }
    Err(PushError::Busy)
}

/// Up to `max` entries from the head, in order: `(seq, payload)`. Stops early at a slot that does not
/// hold the expected seq yet; `stalled` says so (the caller may [`skip`] it after a while).
pub fn peek(store: &dyn SharedStore, max: usize) -> (u64, Vec<(u64, Vec<u8>)>, bool) {
    let (head, tail) = bounds(store);
    let mut out = Vec::new();
    let mut seq = head;
    while seq < tail && out.len() < max {
        let entry = store.get(&slot_key(seq)).ok().flatten().and_then(|(b, _)| {
            (b.first() == Some(&1) && read_u64(&b, 1) == Some(seq))
                .then(|| b.get(9..).map(<[u8]>::to_vec))
                .flatten()
        });
        match entry {
            Some(p) => out.push((seq, p)),
            None => return (head, out, true),
        }
        seq += 1;
    }
    (head, out, false)
}

/// Moves the head from `from` to `to` (entries before `to` were sent). False when someone else moved it
/// first (nothing is changed then).
pub fn advance(store: &dyn SharedStore, from: u64, to: u64, retries: u32) -> bool {
    for _ in 0..=retries {
        let Ok(Some((head, tail, cas))) = read_meta(store) else {
            return false;
        };
        if head != from || to > tail {
            return false;
        }
        match store.set(META, &meta_bytes(to, tail), cas) {
            Ok(()) => return true,
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Host) => return false,
        }
    }
    false
}

/// Takes or renews the journal's claim for `owner` (see [`crate::store::claim`]). True when `owner`
/// holds it.
pub fn claim(store: &dyn SharedStore, owner: u64, now_ns: u64, retries: u32) -> bool {
    crate::store::claim::hold(store, CLAIM, owner, now_ns, retries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn entries_come_out_in_order_and_the_head_moves_past_what_was_sent() {
        let s = MemStore::new();
        init(&s).unwrap();
        for i in 0..5u8 {
            assert_eq!(push(&s, &[i], 8), Ok(u64::from(i)));
        }
        let (head, got, stalled) = peek(&s, 3);
        assert_eq!(head, 0);
        assert!(!stalled);
        assert_eq!(got, vec![(0, vec![0]), (1, vec![1]), (2, vec![2])]);
        assert!(advance(&s, 0, 3, 8));
        assert!(!advance(&s, 0, 3, 8), "already moved");
        let (head, got, _) = peek(&s, 10);
        assert_eq!(head, 3);
        assert_eq!(got, vec![(3, vec![3]), (4, vec![4])]);
        assert_eq!(bounds(&s), (3, 5));
    }

    #[test]
    fn a_full_journal_refuses_and_frees_room_as_the_head_moves() {
        let s = MemStore::new();
        init(&s).unwrap();
        for _ in 0..CAPACITY {
            push(&s, b"x", 8).unwrap();
        }
        assert_eq!(push(&s, b"x", 8), Err(PushError::Full));
        assert!(advance(&s, 0, 1, 8));
        assert_eq!(push(&s, b"y", 8), Ok(CAPACITY));
        // The slot of seq CAPACITY is slot 0 again, and holds the new entry.
        let (_, got, _) = peek(&s, CAPACITY as usize);
        assert_eq!(got.last(), Some(&(CAPACITY, b"y".to_vec())));
    }

    #[test]
    fn a_slot_not_written_yet_stops_the_reader_at_it() {
        let s = MemStore::new();
        init(&s).unwrap();
        push(&s, b"a", 8).unwrap();
        // A push that claimed seq 1 but has not written its slot yet.
        s.set(META, &meta_bytes(0, 2), 0).unwrap();
        push(&s, b"c", 8).unwrap();
        let (_, got, stalled) = peek(&s, 10);
        assert_eq!(got, vec![(0, b"a".to_vec())]);
        assert!(stalled);
    }

    #[test]
    fn one_owner_holds_the_claim_until_it_lapses() {
        let s = MemStore::new();
        assert!(claim(&s, 1, 0, 8));
        assert!(!claim(&s, 2, 1, 8));
        let written = |s: &MemStore| s.get(CLAIM).unwrap().map(|(_, cas)| cas);
        let before = written(&s);
        assert!(claim(&s, 1, 1_000, 8), "held");
        assert_eq!(
            written(&s),
            before,
            "held for more than half its term: not written again"
        );
        let half = CLAIM_NS / 2;
        assert!(claim(&s, 1, half + 1_000, 8), "renewed");
        assert_ne!(
            written(&s),
            before,
            "renewed in the second half of its term"
        );
        assert!(!claim(&s, 2, CLAIM_NS + 1, 8));
        assert!(claim(&s, 2, half + CLAIM_NS + 1_001, 8), "lapsed");
        assert!(!claim(&s, 1, half + CLAIM_NS + 1_002, 8));
    }

    #[test]
    fn owner_ids_are_distinct() {
        let s = MemStore::new();
        let a = owner_id(&s, 8).unwrap();
        let b = owner_id(&s, 8).unwrap();
        assert_ne!(a, b);
        assert!(a >= 1 && b >= 1);
    }

    #[test]
    fn a_corrupt_meta_reads_as_empty_and_is_rewritten_by_the_next_push() {
        let s = MemStore::new();
        s.set(META, b"junk", 0).unwrap();
        assert_eq!(bounds(&s), (0, 0));
        assert_eq!(push(&s, b"a", 8), Ok(0));
        assert_eq!(bounds(&s), (0, 1));
    }
}
