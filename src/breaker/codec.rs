//! The breaker's shared-data encoding: version 1, little-endian, fixed width [`ENCODED_LEN`] = 238 bytes
//! (layout in the [`crate::breaker`] docs). Any other length, version or state byte decodes to `None`
//! (corrupt).

use super::machine::{BreakerState, State};
use super::window::{Bucket, Window, BUCKETS};
use crate::store::{read_u32, read_u64, Codec};

/// Version byte of the encoding.
pub const VERSION: u8 = 1;
/// Length of the encoded [`BreakerState`].
pub const ENCODED_LEN: usize = HEADER_LEN + BUCKETS * BUCKET_LEN;

const HEADER_LEN: usize = 46;
const BUCKET_LEN: usize = 16;

const OFF_STATE: usize = 1;
const OFF_OPENS: usize = 2;
const OFF_PROBES_ISSUED: usize = 6;
const OFF_PROBE_SUCCESSES: usize = 10;
const OFF_OPEN_UNTIL: usize = 14;
const OFF_RETRY_UNTIL: usize = 22;
const OFF_LAST_PROBE: usize = 30;
const OFF_BUCKET_NS: usize = 38;

impl Codec for BreakerState {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(ENCODED_LEN);
        v.push(VERSION);
        v.push(self.state.to_byte());
        v.extend_from_slice(&self.opens.to_le_bytes());
        v.extend_from_slice(&self.probes_issued.to_le_bytes());
        v.extend_from_slice(&self.probe_successes.to_le_bytes());
        v.extend_from_slice(&self.open_until_ns.to_le_bytes());
        v.extend_from_slice(&self.retry_until_ns.to_le_bytes());
        v.extend_from_slice(&self.last_probe_ns.to_le_bytes());
        v.extend_from_slice(&self.window.bucket_ns.to_le_bytes());
        for b in &self.window.buckets {
            v.extend_from_slice(&b.epoch.to_le_bytes());
            v.extend_from_slice(&b.successes.to_le_bytes());
            v.extend_from_slice(&b.failures.to_le_bytes());
        }
        v
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENCODED_LEN || bytes.first() != Some(&VERSION) {
            return None;
        }
        let mut buckets = [Bucket::default(); BUCKETS];
        for (i, b) in buckets.iter_mut().enumerate() {
            let at = HEADER_LEN + i * BUCKET_LEN;
            *b = Bucket {
                epoch: read_u64(bytes, at)?,
                successes: read_u32(bytes, at + 8)?,
                failures: read_u32(bytes, at + 12)?,
            };
        }
        Some(Self {
            state: State::from_byte(*bytes.get(OFF_STATE)?)?,
            opens: read_u32(bytes, OFF_OPENS)?,
            probes_issued: read_u32(bytes, OFF_PROBES_ISSUED)?,
            probe_successes: read_u32(bytes, OFF_PROBE_SUCCESSES)?,
            open_until_ns: read_u64(bytes, OFF_OPEN_UNTIL)?,
            retry_until_ns: read_u64(bytes, OFF_RETRY_UNTIL)?,
            last_probe_ns: read_u64(bytes, OFF_LAST_PROBE)?,
            window: Window {
                bucket_ns: read_u64(bytes, OFF_BUCKET_NS)?,
                buckets,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let c = BreakerConfig {
            failure_rate_percent: Some(90),
            ..cfg()
        };
        let mut s = BreakerState::default();
        for i in 0..30 {
            rec(&mut s, &c, Outcome::Success, false, T0 + i * S);
        }
        rec(&mut s, &c, fail_ra(7_000), false, T0 + 30 * S);
        let s = {
            let mut s = s;
            s.opens = 3;
            s.probes_issued = 2;
            s.probe_successes = 1;
            s.last_probe_ns = 42;
            s.open_until_ns = u64::MAX;
            s
        };
        let bytes = s.encode();
        assert_eq!(bytes.len(), ENCODED_LEN);
        assert_eq!(bytes.len(), 238);
        assert_eq!(bytes[0], 1);
        assert_eq!(BreakerState::decode(&bytes), Some(s));
        for st in [State::Open, State::HalfOpen] {
            let x = BreakerState { state: st, ..s };
            assert_eq!(BreakerState::decode(&x.encode()), Some(x));
        }
    }

    #[test]
    fn corrupt_bytes_decode_to_none() {
        let good = BreakerState::default().encode();
        assert_eq!(BreakerState::decode(&[]), None);
        assert_eq!(BreakerState::decode(&good[..ENCODED_LEN - 1]), None);
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(BreakerState::decode(&longer), None);
        let mut bad_version = good.clone();
        bad_version[0] = 2;
        assert_eq!(BreakerState::decode(&bad_version), None);
        let mut bad_state = good.clone();
        bad_state[1] = 3;
        assert_eq!(BreakerState::decode(&bad_state), None);
    }
}
