//! The set of request breakers that are not CLOSED, kept in one shared-data value
//! ([`OPEN_SET_KEY`]), so that a request learns "every breaker it goes through is closed" from one read
//! of a value that is empty while every breaker is closed, instead of one 238-byte read per breaker key.
//!
//! # Encoding
//! ```text
//! (empty value, or no key)   no breaker is OPEN or HALF_OPEN
//! offset size field          otherwise, version 1:
//!      0    1 version = 1
//!      1    4 n: u32 LE, entries
//!      5    … n × { len: u8, `<scope>=<name>` as in the breaker key after `tg:cb:` }
//! ```
//! An empty value is what makes the common case cheap: the host hands over no bytes (no allocation in
//! the VM, no copy), so the read costs a fraction of a read that returns data. Any other content that
//! does not decode (wrong version, lengths that do not add up) is corrupt: the caller reads every
//! breaker key itself, as if every breaker might be open, and repairs the value ([`repair`]).
//!
//! # How it stays true
//! A breaker key changes state in one CAS ([`super::record_shared`] and friends); the set is changed
//! right after, in a second CAS, by whoever made the change:
//! * CLOSED → OPEN: [`mark`] adds the key (idempotent).
//! * HALF_OPEN → CLOSED: [`unmark`] removes it, then reads the breaker key again and adds it back if it
//!   is no longer CLOSED (another worker re-opened it in between, and its [`mark`] may have come before
//!   this removal). So a removal can never hide a breaker that is open when it ends.
//! * A reader that finds a key in the set but CLOSED in its own record (a removal that was lost)
//!   [`unmark`]s it the same way; a worker that records an outcome on a breaker that is not CLOSED
//!   while the set does not name it (an add that was lost: a host error between the two CASes, or the
//!   key created before this build kept the set) [`mark`]s it.
//!
//! Between the breaker's CAS and the set's, for a few microseconds, a request can still see the old
//! set: that is the same as a request that read the breaker key just before its CAS. A lost add hides
//! an open breaker until one more outcome is recorded on it (the next request sent to it). Changes go
//! through [`store::update`], so the first one creates the key empty and then applies itself by CAS
//! (the create race of `crate::store` applies, once per process).
//!
//! The set names only request breakers (`cluster=…`, `model=…`); it is bounded by `breaker.max_keys`
//! like the keys it names.

pub use super::shared::key_tail_matches;
use super::shared::KEY_PREFIX_LEN;
use super::{BreakerState, State};
use crate::store::{self, Codec, SharedStore, StoreError, UpdateError};

/// Shared-data key of the set (`tg:open:breakers`, outside the `tg:cb:` prefix of the breaker keys).
pub const OPEN_SET_KEY: &str = crate::store::keys::BREAKER_OPEN_SET;

/// Version byte of a non-empty set.
const VERSION: u8 = 1;
const HEADER_LEN: usize = 5;

/// The breakers that were not CLOSED when the set was read, as the key tails `<scope>=<name>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenSet {
    entries: Vec<String>,
}

/// What one read of the set says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    /// The set as read (usually empty).
    Known(OpenSet),
    /// The set could not be read or decoded: every breaker may be open.
    Unknown {
        /// The value was there but did not decode (count it, [`repair`] it).
        corrupt: bool,
    },
}

impl View {
    /// Whether breaker `key(scope, name)` may be OPEN or HALF_OPEN (then its own key must be read).
    pub fn may_be_open(&self, scope: &str, name: &str) -> bool {
        match self {
            View::Known(s) => s.contains(scope, name),
            View::Unknown { .. } => true,
        }
    }

    /// Whether any breaker of `scope` may be OPEN or HALF_OPEN.
    pub fn may_have_scope(&self, scope: &str) -> bool {
        match self {
            View::Known(s) => s.has_scope(scope),
            View::Unknown { .. } => true,
        }
    }
}

impl OpenSet {
    /// True when no breaker is named.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of breakers named.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the breaker `key(scope, name)` is named, without building the key.
    pub fn contains(&self, scope: &str, name: &str) -> bool {
        self.entries
            .iter()
            .any(|e| key_tail_matches(e, scope, name))
    }

    /// Whether the full breaker key `key` is named.
    pub fn contains_key(&self, key: &str) -> bool {
        let tail = key.get(KEY_PREFIX_LEN..).unwrap_or_default();
        self.entries.iter().any(|e| e == tail)
    }

    /// Whether any breaker of `scope` is named.
    pub fn has_scope(&self, scope: &str) -> bool {
        self.entries.iter().any(|e| {
            e.strip_prefix(scope)
                .is_some_and(|rest| rest.starts_with('='))
        })
    }

    /// Adds a full breaker key; false when it was there already (or cannot be encoded).
    fn insert(&mut self, key: &str) -> bool {
        let Some(tail) = key.get(KEY_PREFIX_LEN..) else {
            return false;
        };
        if tail.is_empty() || tail.len() > usize::from(u8::MAX) || self.contains_key(key) {
            return false;
        }
        self.entries.push(tail.to_string());
        true
    }

    /// Removes a full breaker key; false when it was not there.
    fn remove(&mut self, key: &str) -> bool {
        let tail = key.get(KEY_PREFIX_LEN..).unwrap_or_default();
        let before = self.entries.len();
        self.entries.retain(|e| e != tail);
        self.entries.len() != before
    }
}

/// Not fixed-width: the empty set is the empty value (no version byte), the point of the encoding.
impl Codec for OpenSet {
    /// The encoding above (empty for an empty set).
    fn encode(&self) -> Vec<u8> {
        if self.entries.is_empty() {
            return Vec::new();
        }
        let len: usize = self.entries.iter().map(|e| 1 + e.len()).sum();
        let mut v = Vec::with_capacity(HEADER_LEN + len);
        v.push(VERSION);
        v.extend_from_slice(
            &u32::try_from(self.entries.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for e in &self.entries {
            // Tails are at most MAX_SCOPE_BYTES + 1 + MAX_NAME_BYTES (161) bytes: see `insert`.
            v.push(u8::try_from(e.len()).unwrap_or(u8::MAX));
            v.extend_from_slice(e.as_bytes());
        }
        v
    }

    /// Decodes; `None` when corrupt.
    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.is_empty() {
            return Some(OpenSet::default());
        }
        if bytes.first() != Some(&VERSION) {
            return None;
        }
        let n = store::read_u32(bytes, 1)?;
        let mut at = HEADER_LEN;
        // Every entry takes at least 2 bytes: a count beyond that is corrupt (and bounds the Vec).
        if usize::try_from(n).ok()? > bytes.len() / 2 {
            return None;
        }
        let mut entries = Vec::with_capacity(usize::try_from(n).ok()?);
        for _ in 0..n {
            let len = usize::from(*bytes.get(at)?);
            let e = bytes.get(at + 1..at + 1 + len)?;
            entries.push(String::from_utf8(e.to_vec()).ok()?);
            at += 1 + len;
        }
        (at == bytes.len()).then_some(OpenSet { entries })
    }
}

/// Reads the set: one host call, which hands over no bytes while every breaker is closed.
pub fn read(store: &dyn SharedStore) -> View {
    match store.get(OPEN_SET_KEY) {
        Ok(None) => View::Known(OpenSet::default()),
        Ok(Some((bytes, _))) => match OpenSet::decode(&bytes) {
            Some(s) => View::Known(s),
            None => View::Unknown { corrupt: true },
        },
        Err(_) => View::Unknown { corrupt: false },
    }
}

/// One bounded CAS read-modify-write of the set ([`store::update`]): `f` changes it and says whether it
/// did (nothing is written otherwise). A corrupt value is replaced.
fn update(
    store: &dyn SharedStore,
    max_retries: u32,
    mut f: impl FnMut(&mut OpenSet) -> bool,
) -> Result<bool, UpdateError> {
    store::update(store, OPEN_SET_KEY, max_retries, &OpenSet::default(), |s| {
        let mut next = s.clone();
        if f(&mut next) {
            (true, Some(next))
        } else {
            (false, None)
        }
    })
    .map(|(changed, _)| changed)
}

/// Names breaker `key` in the set (nothing is written when it is named already).
pub fn mark(store: &dyn SharedStore, key: &str, max_retries: u32) -> Result<(), UpdateError> {
    update(store, max_retries, |s| s.insert(key)).map(|_| ())
}

/// Removes breaker `key` from the set, then reads the breaker again and names it again if it is not
/// CLOSED by then (see the module docs: a removal never hides a breaker that is open when it ends).
pub fn unmark(store: &dyn SharedStore, key: &str, max_retries: u32) -> Result<(), UpdateError> {
    if !update(store, max_retries, |s| s.remove(key))? {
        return Ok(());
    }
    match store::peek::<BreakerState>(store, key) {
        Ok((Some(st), _)) if st.state() != State::Closed => mark(store, key, max_retries),
        Ok(_) => Ok(()),
        // Cannot tell: name it again (a closed breaker in the set only costs its readers one read).
        Err(_) => mark(store, key, max_retries),
    }
}

/// Replaces a corrupt set by an empty one (breakers open at that moment are named again by their next
/// recorded outcome). Nothing is written when the value decodes by now.
pub fn repair(store: &dyn SharedStore) -> Result<(), StoreError> {
    match store.get(OPEN_SET_KEY)? {
        Some((bytes, cas)) if OpenSet::decode(&bytes).is_none() => {
            store.set(OPEN_SET_KEY, &[], cas)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn an_empty_set_is_an_empty_value_and_a_missing_key_reads_empty() {
        let store = MemStore::new();
        assert_eq!(read(&store), View::Known(OpenSet::default()));
        assert!(OpenSet::default().encode().is_empty());
        store.set(OPEN_SET_KEY, &[], 0).unwrap();
        assert_eq!(read(&store), View::Known(OpenSet::default()));
    }

    #[test]
    fn entries_round_trip_and_match_without_building_keys() {
        let mut s = OpenSet::default();
        assert!(s.insert(&key("model", "gpt-4.1")));
        assert!(!s.insert(&key("model", "gpt-4.1")));
        assert!(s.insert(&key("cluster", "a b")));
        let d = OpenSet::decode(&s.encode()).unwrap();
        assert_eq!(d, s);
        assert_eq!(d.len(), 2);
        assert!(d.contains("model", "gpt-4.1"));
        assert!(d.contains("cluster", "a b"), "sanitized like the key");
        assert!(d.contains("cluster", "a_b"));
        assert!(!d.contains("model", "gpt-4"));
        assert!(!d.contains("model", "gpt-4.10"));
        assert!(!d.contains("cluster", "gpt-4.1"));
        assert!(d.has_scope("cluster") && d.has_scope("model") && !d.has_scope("shim"));
        let long = "x".repeat(500);
        let mut s = OpenSet::default();
        assert!(s.insert(&key("model", &long)));
        let d = OpenSet::decode(&s.encode()).unwrap();
        assert!(d.contains("model", &long), "names are cut like keys");
        assert!(d.contains_key(&key("model", &long)));
    }

    #[test]
    fn values_that_do_not_add_up_are_corrupt() {
        let mut s = OpenSet::default();
        s.insert(&key("model", "m"));
        let good = s.encode();
        assert!(OpenSet::decode(&good).is_some());
        for bad in [
            vec![2u8],
            vec![1u8, 0, 0],
            good[..good.len() - 1].to_vec(),
            [good.clone(), vec![0]].concat(),
            vec![1u8, 255, 255, 255, 255, 0],
        ] {
            assert_eq!(OpenSet::decode(&bad), None, "{bad:?}");
        }
        let store = MemStore::new();
        store.set(OPEN_SET_KEY, b"junk", 0).unwrap();
        assert_eq!(read(&store), View::Unknown { corrupt: true });
        repair(&store).unwrap();
        assert_eq!(read(&store), View::Known(OpenSet::default()));
    }

    #[test]
    fn mark_is_idempotent_and_unmark_removes() {
        let store = MemStore::new();
        let k = key("model", "m");
        mark(&store, &k, 8).unwrap();
        let (_, cas) = store.get(OPEN_SET_KEY).unwrap().unwrap();
        mark(&store, &k, 8).unwrap();
        assert_eq!(
            store.get(OPEN_SET_KEY).unwrap().unwrap().1,
            cas,
            "nothing written"
        );
        let View::Known(s) = read(&store) else {
            panic!("unknown")
        };
        assert!(s.contains("model", "m"));
        // The breaker key itself does not exist: it reads CLOSED, so the removal stands.
        unmark(&store, &k, 8).unwrap();
        assert_eq!(read(&store), View::Known(OpenSet::default()));
        assert!(store.get(OPEN_SET_KEY).unwrap().unwrap().0.is_empty());
    }

    /// A store that lets "the other worker" run once, right after our first read.
    struct Racing<'a, F: FnMut(&MemStore)> {
        inner: &'a MemStore,
        other: std::cell::RefCell<Option<F>>,
    }

    impl<F: FnMut(&MemStore)> SharedStore for Racing<'_, F> {
        fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
            let r = self.inner.get(key);
            if let Some(mut other) = self.other.borrow_mut().take() {
                other(self.inner);
            }
            r
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            self.inner.set(key, value, cas)
        }
    }

    #[test]
    fn two_workers_naming_breakers_at_once_both_stay_named() {
        let store = MemStore::new();
        // The key exists (empty), as after any earlier open and close.
        store.set(OPEN_SET_KEY, &[], 0).unwrap();
        let racing = Racing {
            inner: &store,
            other: std::cell::RefCell::new(Some(|s: &MemStore| {
                mark(s, &key("cluster", "b"), 8).unwrap();
            })),
        };
        mark(&racing, &key("model", "a"), 8).unwrap();
        let View::Known(set) = read(&store) else {
            panic!("unknown")
        };
        assert!(set.contains("model", "a") && set.contains("cluster", "b"));
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn a_removal_based_on_a_stale_closed_read_does_not_hide_a_breaker_that_reopened() {
        let store = MemStore::new();
        let c = cfg();
        let k = key("model", "m");
        // A stale entry (its removal was lost) and a reader that saw the breaker CLOSED…
        mark(&store, &k, 8).unwrap();
        // …while another worker re-opens it; its mark finds the entry there and writes nothing.
        for _ in 0..c.failure_threshold {
            record_shared(&store, &k, &c, fail(), false, T0, 8).unwrap();
        }
        mark(&store, &k, 8).unwrap();
        // The reader's removal comes last: it checks the breaker again and names it again.
        unmark(&store, &k, 8).unwrap();
        let View::Known(s) = read(&store) else {
            panic!("unknown")
        };
        assert!(s.contains("model", "m"), "an open breaker stays named");
    }
}
