//! Shared-data access: the `SharedStore` trait, one bounded CAS read-modify-write helper, and key names.
//!
//! Envoy's shared data is a process-wide key/value map shared by every worker VM with the same `vm_id`.
//! Every value carries a CAS token; `set(key, value, cas)` fails with `CasMismatch` when another worker
//! wrote in between. Two rules of Envoy shape this module:
//!
//! * A `set` on a key that does not exist yet ignores the CAS token: two workers that both see the key
//!   missing can both "create" it and the later write wins. [`update`] therefore first creates a missing
//!   key with the *initial* state (no charge applied) and only then applies the change through a real CAS.
//!   The loss is bounded: at most one concurrent creator per extra worker can overwrite a change made in
//!   the few microseconds between its read and its create, once per key lifetime.
//! * Keys are never evicted. Callers bound how many keys they create (see [`crate::store::keys`]).
//!
//! Pure logic never talks to Envoy: it gets a `&dyn SharedStore`, and tests use [`MemStore`], which follows
//! Envoy's CAS rules exactly (including the create race) so two "workers" can be interleaved.
//!
//! Key naming: `tg:<kind>:…` — e.g. `tg:b:gpt:acme:gpt-4.1` (bucket of rule `gpt` for tenant `acme` and a
//! model), `tg:cb:model=gpt-4.1` (breaker), `tg:q:x:<tenant>` (quota exhausted marker); every prefix is
//! named in [`crate::store::keys`].

pub mod claim;
pub mod hash;
pub mod journal;
pub mod keys;
pub mod registry;

/// Why a shared-data operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Another worker wrote the key after we read it.
    CasMismatch,
    /// The host refused the call (any other status).
    Host,
}

/// The host's shared data, as seen by pure logic.
pub trait SharedStore {
    /// Returns the value and its CAS token, or `None` if the key does not exist.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError>;
    /// Writes `value` if the key's CAS token is still `cas` (0 = unconditional). A missing key is
    /// always written, whatever `cas` says (Envoy's rule).
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// Why [`update`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateError {
    /// Every retry lost the CAS race.
    CasExhausted,
    /// The host refused a read or write.
    Host,
}

/// What [`update`] observed besides the decision: useful for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpdateStats {
    /// CAS conflicts met before success.
    pub retries: u32,
    /// The stored value had a wrong length or version and was treated as fresh.
    pub corrupt: bool,
    /// The key did not exist and this call created it.
    pub created: bool,
}

/// A state that can live in shared data as fixed-width bytes.
pub trait Codec: Sized {
    /// Encodes into the fixed-width form with its version byte first.
    fn encode(&self) -> Vec<u8>;
    /// Decodes; `None` when the length or version is wrong (corrupt).
    fn decode(bytes: &[u8]) -> Option<Self>;
}

/// One read-modify-write of `key`, retried at most `max_retries` times on CAS conflicts.
///
/// `f(state)` is pure: given the current state (`None` when absent or corrupt) it returns the decision and
/// the new state. When `f` returns `None` as new state nothing is written (a read-only decision).
/// A missing key is first created with `init` (no change applied) so the change itself always goes
/// through a real CAS; see the module docs for the remaining create race.
pub fn update<S, D, F>(
    store: &dyn SharedStore,
    key: &str,
    max_retries: u32,
    init: &S,
    f: F,
) -> Result<(D, UpdateStats), UpdateError>
where
    S: Codec,
    F: FnMut(&S) -> (D, Option<S>),
{
    update_from(store, key, max_retries, init, None, f)
}

/// A value and its CAS token as [`SharedStore::get`] returned them (kept to save a later read).
pub type Seen = (Vec<u8>, u32);

/// [`update`], starting from `seen` (an earlier [`SharedStore::get`] of `key`) instead of a fresh read.
/// The CAS makes this exact: if anyone wrote `key` since `seen` was read, the write fails and the loop
/// reads afresh. That stale first attempt is not counted as a conflict (`stats.retries`) nor against
/// `max_retries`.
pub fn update_from<S, D, F>(
    store: &dyn SharedStore,
    key: &str,
    max_retries: u32,
    init: &S,
    mut seen: Option<Seen>,
    mut f: F,
) -> Result<(D, UpdateStats), UpdateError>
where
    S: Codec,
    F: FnMut(&S) -> (D, Option<S>),
{
    let mut stats = UpdateStats::default();
    let mut attempt = 0u32;
    loop {
        // Step 1: read. A missing key is created with `init` and read back, so that the change in step 2
        // is a real CAS against a known token.
        let earlier = seen.take();
        let from_earlier = earlier.is_some();
        let read = match earlier {
            Some(v) => Some(v),
            None => store.get(key).map_err(|_| UpdateError::Host)?,
        };
        let (state, cas) = match read {
            Some((bytes, cas)) => match S::decode(&bytes) {
                Some(s) => (s, cas),
                None => {
                    stats.corrupt = true;
                    (S::decode(&init.encode()).ok_or(UpdateError::Host)?, cas)
                }
            },
            None => {
                stats.created = true;
                store
                    .set(key, &init.encode(), 0)
                    .map_err(|_| UpdateError::Host)?;
                attempt += 1;
                if attempt > max_retries.saturating_add(1) {
                    return Err(UpdateError::CasExhausted);
                }
                continue;
            }
        };
        // Step 2: decide, then write only if nobody wrote since step 1.
        let (decision, next) = f(&state);
        let Some(next) = next else {
            return Ok((decision, stats));
        };
        match store.set(key, &next.encode(), cas) {
            Ok(()) => return Ok((decision, stats)),
            Err(StoreError::CasMismatch) if from_earlier => {}
            Err(StoreError::CasMismatch) => {
                stats.retries += 1;
                attempt += 1;
                if stats.retries > max_retries {
                    return Err(UpdateError::CasExhausted);
                }
            }
            Err(StoreError::Host) => return Err(UpdateError::Host),
        }
    }
}

/// Reads and decodes a key without writing. `Ok(None)` when missing; corrupt values read as `None` too,
/// with the flag set.
pub fn peek<S: Codec>(store: &dyn SharedStore, key: &str) -> Result<(Option<S>, bool), StoreError> {
    match store.get(key)? {
        Some((bytes, _)) => match S::decode(&bytes) {
            Some(s) => Ok((Some(s), false)),
            None => Ok((None, true)),
        },
        None => Ok((None, false)),
    }
}

/// An in-memory store with Envoy's CAS rules, for tests and benchmarks.
#[derive(Default)]
pub struct MemStore {
    map: std::cell::RefCell<std::collections::HashMap<String, (Vec<u8>, u32)>>,
    reads: std::cell::Cell<u64>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
    /// Number of keys (tests check key bounds with it).
    pub fn len(&self) -> usize {
        self.map.borrow().len()
    }
    /// True when no key exists.
    pub fn is_empty(&self) -> bool {
        self.map.borrow().is_empty()
    }
    /// Reads so far (tests check that a path needs none).
    pub fn reads(&self) -> u64 {
        self.reads.get()
    }
    /// Every key, sorted (tests check which keys a request created).
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.map.borrow().keys().cloned().collect();
        k.sort();
        k
    }
}

impl SharedStore for MemStore {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
        self.reads.set(self.reads.get().saturating_add(1));
        Ok(self.map.borrow().get(key).cloned())
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let mut map = self.map.borrow_mut();
        match map.get_mut(key) {
            Some(entry) => {
                if cas != 0 && entry.1 != cas {
                    return Err(StoreError::CasMismatch);
                }
                entry.0 = value.to_vec();
                entry.1 = entry.1.wrapping_add(1).max(1);
            }
            None => {
                map.insert(key.to_string(), (value.to_vec(), 1));
            }
        }
        Ok(())
    }
}

/// A shared count (of created keys, for the `tg:n:*` bounds): `[1][count u64 LE]`, 9 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub u64);

impl Codec for Count {
    fn encode(&self) -> Vec<u8> {
        let mut v = vec![1u8];
        v.extend_from_slice(&self.0.to_le_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != 9 || b.first() != Some(&1) {
            return None;
        }
        read_u64(b, 1).map(Count)
    }
}

/// Reads a little-endian u64 at `at`; `None` when out of range.
pub fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let slice = bytes.get(at..at.checked_add(8)?)?;
    let arr: [u8; 8] = slice.try_into().ok()?;
    Some(u64::from_le_bytes(arr))
}

/// Reads a little-endian f64 at `at`; `None` when out of range or not finite.
pub fn read_f64(bytes: &[u8], at: usize) -> Option<f64> {
    let v = f64::from_bits(read_u64(bytes, at)?);
    v.is_finite().then_some(v)
}

/// Reads a little-endian u32 at `at`; `None` when out of range.
pub fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let slice = bytes.get(at..at.checked_add(4)?)?;
    let arr: [u8; 4] = slice.try_into().ok()?;
    Some(u32::from_le_bytes(arr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_creates_missing_key_then_applies_change_through_cas() {
        let s = MemStore::new();
        let (d, st) = update(&s, "k", 3, &Count(0), |c| (c.0, Some(Count(c.0 + 5)))).unwrap();
        assert_eq!(d, 0);
        assert!(st.created);
        let (v, _) = peek::<Count>(&s, "k").unwrap();
        assert_eq!(v, Some(Count(5)));
    }

    #[test]
    fn corrupt_value_is_treated_as_fresh_and_flagged() {
        let s = MemStore::new();
        s.set("k", b"garbage", 0).unwrap();
        let (_, st) = update(&s, "k", 3, &Count(0), |c| ((), Some(Count(c.0 + 1)))).unwrap();
        assert!(st.corrupt);
        assert_eq!(peek::<Count>(&s, "k").unwrap().0, Some(Count(1)));
    }

    #[test]
    fn cas_conflict_from_another_worker_is_retried() {
        let s = MemStore::new();
        s.set("k", &Count(0).encode(), 0).unwrap();
        let mut first = true;
        let (_, st) = update(&s, "k", 3, &Count(0), |c| {
            if first {
                first = false;
                // another worker increments between our read and write
                let (_, cas) = s.get("k").unwrap().unwrap();
                s.set("k", &Count(c.0 + 10).encode(), cas).unwrap();
            }
            ((), Some(Count(c.0 + 1)))
        })
        .unwrap();
        assert_eq!(st.retries, 1);
        assert_eq!(peek::<Count>(&s, "k").unwrap().0, Some(Count(11)));
    }

    #[test]
    fn cas_exhaustion_is_reported_not_ignored() {
        let s = MemStore::new();
        s.set("k", &Count(0).encode(), 0).unwrap();
        let r = update(&s, "k", 2, &Count(0), |c| {
            let (_, cas) = s.get("k").unwrap().unwrap();
            s.set("k", &Count(c.0 + 1).encode(), cas).unwrap();
            ((), Some(Count(c.0 + 1)))
        });
        assert_eq!(r.unwrap_err(), UpdateError::CasExhausted);
    }

    #[test]
    fn read_only_decision_writes_nothing() {
        let s = MemStore::new();
        s.set("k", &Count(7).encode(), 0).unwrap();
        let (_, cas0) = s.get("k").unwrap().unwrap();
        update(&s, "k", 3, &Count(0), |_| ((), None::<Count>)).unwrap();
        assert_eq!(s.get("k").unwrap().unwrap().1, cas0);
    }

    #[test]
    fn readers_reject_out_of_range_offsets() {
        assert_eq!(read_u64(&[0; 4], 0), None);
        assert_eq!(read_u64(&[0; 9], usize::MAX), None);
        assert_eq!(read_f64(&f64::NAN.to_le_bytes(), 0), None);
    }
}
