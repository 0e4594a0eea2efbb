//! Bounds on the keys the filter creates in shared data, which never evicts: a shared count per kind
//! of key admits at most `max_tenants` of them ([`claim_slot`], with a per-VM cache of keys known to
//! exist), and a [`Registry`] lists the keys a leader VM walks (quota and global-bucket lease accounts).
//!
//! ```text
//! tg:n:<kind>       [v=1][count u64]      how many keys of the kind were created
//! <slot prefix><i>  the key of entry i    (a Registry's entries)
//! ```

use crate::store::hash::FnvBuild;
use crate::store::{self, peek, update, Count, SharedStore};
use std::collections::HashSet;

/// The per-VM cache of keys known to exist.
pub type KeySet = HashSet<String, FnvBuild>;

/// Claims a slot for `key` under a shared count bounded by `max` (or finds it already exists).
/// `known` caches keys this VM has seen existing (cleared past `cache_limit`). False = no slot left.
pub fn claim_slot(
    store: &dyn SharedStore,
    counter_key: &str,
    max: u32,
    retries: u32,
    known: &mut KeySet,
    cache_limit: usize,
    key: &str,
) -> bool {
    if known.contains(key) {
        return true;
    }
    let exists = matches!(store.get(key), Ok(Some(_)));
    let slot = exists
        || matches!(
            store::update(store, counter_key, retries, &store::Count(0), |c| {
                if c.0 < u64::from(max) {
                    (true, Some(store::Count(c.0 + 1)))
                } else {
                    (false, None)
                }
            }),
            Ok((true, _))
        );
    if slot {
        if known.len() >= cache_limit {
            known.clear();
        }
        known.insert(key.to_string());
    }
    slot
}

/// A bounded registry of keys in shared data, for a leader VM to walk: a count at `counter` and entry
/// number `i` at `<slot><i>` (quota leases and global-bucket leases each have one).
#[derive(Debug, Clone, Copy)]
pub struct Registry {
    /// Key of the count of entries.
    pub counter: &'static str,
    /// Prefix of the entries' keys.
    pub slot: &'static str,
}

impl Registry {
    /// Adds `entry` (bounded by `max`). False when full (or the store failed).
    pub fn register(&self, store: &dyn SharedStore, entry: &str, max: u32, retries: u32) -> bool {
        let n = update(store, self.counter, retries, &Count(0), |c: &Count| {
            if c.0 >= u64::from(max) {
                (None, None)
            } else {
                (Some(c.0), Some(Count(c.0 + 1)))
            }
        });
        match n {
            Ok((Some(i), _)) => store.set(&self.slot_key(i), entry.as_bytes(), 0).is_ok(),
            _ => false,
        }
    }

    /// The key of entry number `i`.
    pub fn slot_key(&self, i: u64) -> String {
        format!("{}{i}", self.slot)
    }

    /// How many entries are registered.
    pub fn registered(&self, store: &dyn SharedStore) -> u64 {
        peek::<Count>(store, self.counter)
            .ok()
            .and_then(|(c, _)| c)
            .map_or(0, |c| c.0)
    }

    /// Entry number `i`.
    pub fn slot(&self, store: &dyn SharedStore, i: u64) -> Option<String> {
        let (b, _) = store.get(&self.slot_key(i)).ok()??;
        String::from_utf8(b).ok()
    }
}
