//! FNV-1a (64 bit): the one non-cryptographic hash of the crate, and a `Hasher` built on it.
//!
//! It names overflow buckets, shortens long key parts (`…~<16 hex>`), fingerprints request bodies for
//! idempotency, picks refusal-cache slots and keys the per-VM hash maps. Keys hashed here are short and
//! chosen by this filter (tenant names are bounded by `max_tenants`), so SipHash's flood resistance
//! buys nothing on the per-request lookup.
//!
//! ```
//! # use tokengate::store::hash::{fnv1a, FNV_OFFSET};
//! assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
//! assert_eq!(fnv1a(fnv1a(FNV_OFFSET, b"fo"), b"o"), fnv1a(FNV_OFFSET, b"foo"));
//! ```
//!
//! This module depends on nothing else in the crate, so every module may use it (it used to live in
//! `store` and `admission`, which made `admission → config → identity → admission` a circle).

use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a's offset basis: the starting value for [`fnv1a`].
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a (64 bit) of `bytes`, continuing from `h` (start with [`FNV_OFFSET`]). The one hash behind
/// overflow buckets, shortened key parts, the key cache's hasher and the API-key cache.
pub fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// FNV-1a as a `Hasher`: keys are short and chosen by this filter (tenant names are bounded by
/// `max_tenants`), so SipHash's flood resistance buys nothing on the per-request lookup.
#[derive(Default)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let h = if self.0 == 0 { FNV_OFFSET } else { self.0 };
        self.0 = fnv1a(h, bytes);
    }
}

/// `BuildHasher` of [`Fnv`].
pub type FnvBuild = BuildHasherDefault<Fnv>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(
            fnv1a(fnv1a(FNV_OFFSET, b"foo"), b"bar"),
            fnv1a(FNV_OFFSET, b"foobar")
        );
    }

    #[test]
    fn the_hasher_starts_from_the_offset_basis() {
        let mut h = FnvBuild::default().build_hasher();
        h.write(b"foobar");
        assert_eq!(h.finish(), 0x8594_4171_f739_67e8);
    }
}
