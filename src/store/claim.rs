//! Leader claims in shared data: one VM of the process holds a role (sending the settlement journal,
//! walking the quota or global-bucket lease accounts) until its claim lapses, renewing it as it works.
//!
//! ```text
//! <role key>    [v=1][owner u64][until_ns u64]     who holds the role, and until when (renewed)
//! tg:n:vms      a count: each VM takes a number from it (its owner id)
//! ```
//!
//! A claim not renewed for [`CLAIM_NS`] passes to the next VM that asks: the work a role does must be
//! safe to do twice (the settle script is idempotent; a lease sync is versioned).

use crate::store::{read_u64, SharedStore, StoreError};

/// How long a claim lasts without being renewed.
pub const CLAIM_NS: u64 = 2_000_000_000;
/// The count VMs take their owner ids from.
pub const OWNERS: &str = "tg:n:vms";

/// Takes or renews the claim at `key` for `owner` until `now + CLAIM_NS`: one VM of the process holds
/// it at a time. True when `owner` holds it.
pub fn hold(store: &dyn SharedStore, key: &str, owner: u64, now_ns: u64, retries: u32) -> bool {
    for _ in 0..=retries {
        let current = match store.get(key) {
            Ok(v) => v,
            Err(_) => return false,
        };
        let (holder, until, cas) = match &current {
            Some((b, cas)) if b.len() == 17 && b.first() == Some(&1) => (
                read_u64(b, 1).unwrap_or(0),
                read_u64(b, 9).unwrap_or(0),
                *cas,
            ),
            Some((_, cas)) => (0, 0, *cas),
            None => (0, 0, 0),
        };
        if holder != owner && until > now_ns {
            return false;
        }
        if holder == owner && until.saturating_sub(now_ns) > CLAIM_NS / 2 {
            // Held for more than half its term: renewed later (a write saved at every tick).
            return true;
        }
        let mut v = Vec::with_capacity(17);
        v.push(1);
        v.extend_from_slice(&owner.to_le_bytes());
        v.extend_from_slice(&now_ns.saturating_add(CLAIM_NS).to_le_bytes());
        match store.set(key, &v, cas) {
            // A missing claim key ignores the CAS: read it back to see who won.
            Ok(()) if current.is_none() => {
                return matches!(store.get(key), Ok(Some((b, _))) if read_u64(&b, 1) == Some(owner))
            }
            Ok(()) => return true,
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Host) => return false,
        }
    }
    false
}

/// A number no other VM of this Envoy got (1, 2, …): a VM's owner id for [`hold`].
pub fn owner_id(store: &dyn SharedStore, retries: u32) -> Option<u64> {
    let init = crate::store::Count(0);
    crate::store::update(store, OWNERS, retries, &init, |c: &crate::store::Count| {
        let n = c.0.saturating_add(1);
        (n, Some(crate::store::Count(n)))
    })
    .ok()
    .map(|(n, _)| n)
}
