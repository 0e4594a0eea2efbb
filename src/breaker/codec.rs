//! The breaker's shared-data encoding: version 1, little-endian, fixed width [`ENCODED_LEN`] = 238 bytes
//! (layout in the [`crate::breaker`] docs). Any other length, version or state byte decodes to `None`
//! (corrupt).

use super::machine::{BreakerConfig, BreakerState, State};
use super::window::{self, Bucket, Window, BUCKETS};
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

/// What [`add_successes_in_place`] found in an encoded record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InPlace {
    /// The successes were added to their sub-window; the window now holds this many outcomes.
    Added {
        /// Successes and failures in the window afterwards.
        window_total: u64,
    },
    /// Nothing to count (not CLOSED, no rate rule, or no success): the record is unchanged.
    Unchanged(State),
    /// Not a record of this version, length and sub-window width (corrupt, or counted under another
    /// `window_ms`): it must be decoded and repaired or reset the whole way.
    Whole,
}

/// Adds `n` plain successes to the sub-window of `now_ns` in the encoded record `bytes`, touching that
/// sub-window's 16 bytes only: the rest of the record is neither decoded nor encoded again. The bytes
/// afterwards are exactly those of [`super::record_successes`] then [`Codec::encode`] (see the tests);
/// the window total is read from the other sub-windows' counts.
pub(super) fn add_successes_in_place(
    bytes: &mut [u8],
    cfg: &BreakerConfig,
    n: u32,
    now_ns: u64,
) -> InPlace {
    if bytes.len() != ENCODED_LEN || bytes.first() != Some(&VERSION) {
        return InPlace::Whole;
    }
    let Some(state) = bytes.get(OFF_STATE).copied().and_then(State::from_byte) else {
        return InPlace::Whole;
    };
    let width = window::bucket_ns(cfg.window_ms);
    if read_u64(bytes, OFF_BUCKET_NS) != Some(width) {
        return InPlace::Whole;
    }
    if state != State::Closed || n == 0 || cfg.failure_rate_percent.is_none() {
        return InPlace::Unchanged(state);
    }
    let (slot, cur) = window::slot_at(width, now_ns);
    let at = HEADER_LEN + slot * BUCKET_LEN;
    let (Some(epoch), Some(successes)) = (read_u64(bytes, at), read_u32(bytes, at + 8)) else {
        return InPlace::Whole;
    };
    // A slot still holding an older epoch is reset first (as `Window::add` does).
    let (successes, reset) = if epoch == cur {
        (successes.saturating_add(n), false)
    } else {
        (n, true)
    };
    let mut put = |off: usize, v: &[u8]| {
        if let Some(dst) = bytes.get_mut(off..off + v.len()) {
            dst.copy_from_slice(v);
        }
    };
    put(at, &cur.to_le_bytes());
    put(at + 8, &successes.to_le_bytes());
    if reset {
        put(at + 12, &0u32.to_le_bytes());
    }
    let mut window_total = 0u64;
    for i in 0..BUCKETS {
        let at = HEADER_LEN + i * BUCKET_LEN;
        if let (Some(e), Some(s), Some(f)) = (
            read_u64(bytes, at),
            read_u32(bytes, at + 8),
            read_u32(bytes, at + 12),
        ) {
            if window::in_window(e, cur) {
                window_total += u64::from(s) + u64::from(f);
            }
        }
    }
    InPlace::Added { window_total }
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
    fn successes_added_in_place_are_the_bytes_the_whole_way_writes() {
        let rate = BreakerConfig {
            failure_threshold: u32::MAX,
            failure_rate_percent: Some(50),
            ..cfg()
        };
        // A record never counted in has no width yet: the whole way sets it.
        let mut b = BreakerState::default().encode();
        assert_eq!(add_successes_in_place(&mut b, &rate, 1, T0), InPlace::Whole);
        // Windows of every age: fresh, in the same sub-window, a slot a full turn old, sparse.
        let mut states = vec![];
        let mut s = BreakerState::default();
        for i in 0..40u64 {
            if i % 3 == 0 {
                rec(&mut s, &rate, fail(), false, T0 + i * 2 * S);
            } else {
                rec(&mut s, &rate, Outcome::Success, false, T0 + i * 2 * S);
            }
            if s.state() == State::Closed {
                states.push(s);
            }
        }
        for st in &states {
            for dt in [
                0,
                1,
                4_999 * NS_PER_MS,
                5 * S,
                59 * S,
                60 * S,
                61 * S,
                200 * S,
            ] {
                for n in [1u32, 7, u32::MAX] {
                    let now = T0 + 79 * S + dt;
                    let whole = record_successes(st, &rate, n, now).unwrap();
                    let mut bytes = st.encode();
                    let got = add_successes_in_place(&mut bytes, &rate, n, now);
                    assert_eq!(bytes, whole.encode(), "dt {dt} n {n}");
                    let (ok, failed) = whole.window_counts(&rate, now);
                    assert_eq!(
                        got,
                        InPlace::Added {
                            window_total: ok + failed
                        }
                    );
                }
            }
        }
    }

    #[test]
    fn a_record_that_cannot_take_successes_in_place_says_why() {
        let rate = BreakerConfig {
            failure_rate_percent: Some(50),
            ..cfg()
        };
        let mut fresh = BreakerState::default();
        rec(&mut fresh, &rate, fail(), false, T0);
        let good = fresh.encode();
        // Not CLOSED, or no rate rule: nothing is counted, nothing changes.
        for (st, c) in [(opened(&rate), &rate), (fresh, &cfg())] {
            let mut b = st.encode();
            assert_eq!(
                add_successes_in_place(&mut b, c, 3, T0),
                InPlace::Unchanged(st.state())
            );
            assert_eq!(b, st.encode());
        }
        // Corrupt, or counted with another width: the whole way (decode, reset, repair).
        let wider = BreakerConfig {
            window_ms: 120_000,
            ..rate.clone()
        };
        let mut b = good.clone();
        assert_eq!(
            add_successes_in_place(&mut b, &wider, 3, T0),
            InPlace::Whole
        );
        for bad in [&good[..10], &[2u8; ENCODED_LEN][..]] {
            let mut b = bad.to_vec();
            assert_eq!(add_successes_in_place(&mut b, &rate, 3, T0), InPlace::Whole);
        }
        let mut bad_state = good.clone();
        bad_state[1] = 9;
        assert_eq!(
            add_successes_in_place(&mut bad_state, &rate, 3, T0),
            InPlace::Whole
        );
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
