//! The quota-exhausted marker: a tenant known to be out of quota is refused from Envoy shared data in the
//! headers phase, without a callout, until the marker expires.

use crate::store::keys::sanitize;
use crate::store::{read_u64, Codec};

/// "This tenant is out of quota until `month_end_unix`", cached in Envoy shared data so later requests
/// are rejected in the headers phase without a callout.
///
/// Encoding: [`Self::LEN`] = 33 bytes, `[2][month_end_unix: i64 LE][limit: u64 LE][config_limit: u64 LE]
/// [remaining: u64 LE]`. Note: raising a tenant's override in Redis does not clear a cached marker (shared
/// data has no delete); the host re-checks Redis now and then (`quota.exhausted_recheck_s`), and a
/// configured limit other than `config_limit` voids the marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExhaustedMarker {
    /// Until when the marker holds: at the latest when the quota resets
    /// ([`crate::quota::calendar::month_end_unix`]); the host writes an earlier instant to re-check Redis.
    pub month_end_unix: i64,
    /// The effective limit that was exhausted (override or configured), for the 429.
    pub limit: u64,
    /// The configured limit when the marker was written: a configuration change voids the marker.
    pub config_limit: u64,
    /// What was left (below the exhaustion threshold), for the 429's headers.
    pub remaining: u64,
}

impl ExhaustedMarker {
    /// Version byte of the encoding.
    pub const VERSION: u8 = 2;
    /// Encoded length: `[version=2][valid_until i64][limit u64][config_limit u64][remaining u64]`.
    pub const LEN: usize = 33;

    /// True while the marker still blocks the tenant.
    pub fn is_active(&self, now_unix_s: i64) -> bool {
        now_unix_s < self.month_end_unix
    }

    /// Shared-data key of a tenant's marker: `tg:q:x:<sanitized tenant>`.
    pub fn key(tenant: &str) -> String {
        format!(
            "{}{}",
            crate::store::keys::QUOTA_EXHAUSTED,
            sanitize(tenant)
        )
    }
}

impl Codec for ExhaustedMarker {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        v.push(Self::VERSION);
        v.extend_from_slice(&self.month_end_unix.to_le_bytes());
        v.extend_from_slice(&self.limit.to_le_bytes());
        v.extend_from_slice(&self.config_limit.to_le_bytes());
        v.extend_from_slice(&self.remaining.to_le_bytes());
        v
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != Self::LEN || bytes.first() != Some(&Self::VERSION) {
            return None;
        }
        Some(Self {
            month_end_unix: i64::from_le_bytes(read_u64(bytes, 1)?.to_le_bytes()),
            limit: read_u64(bytes, 9)?,
            config_limit: read_u64(bytes, 17)?,
            remaining: read_u64(bytes, 25)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhausted_marker_round_trips_and_rejects_wrong_length_or_version() {
        let m = ExhaustedMarker {
            month_end_unix: 1_796_083_200,
            limit: 5_000_000,
            config_limit: 6_000_000,
            remaining: 3,
        };
        let bytes = m.encode();
        assert_eq!(bytes.len(), ExhaustedMarker::LEN);
        assert_eq!(ExhaustedMarker::decode(&bytes), Some(m));
        let mut v2 = bytes.clone();
        v2[0] = 1;
        assert_eq!(ExhaustedMarker::decode(&v2), None);
        assert_eq!(ExhaustedMarker::decode(&bytes[..32]), None);
        assert_eq!(ExhaustedMarker::decode(&[]), None);
        assert!(m.is_active(1_796_083_199));
        assert!(!m.is_active(1_796_083_200));
        assert_eq!(ExhaustedMarker::key("a b"), "tg:q:x:a%20b");
    }

    #[test]
    fn exhausted_marker_works_through_the_shared_store_helpers() {
        let s = crate::store::MemStore::new();
        let m = ExhaustedMarker {
            month_end_unix: -5,
            limit: 7,
            config_limit: 7,
            remaining: 0,
        };
        crate::store::SharedStore::set(&s, "k", &m.encode(), 0).unwrap();
        assert_eq!(
            crate::store::peek::<ExhaustedMarker>(&s, "k").unwrap(),
            (Some(m), false)
        );
    }
}
