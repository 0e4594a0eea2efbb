//! A quota settlement as it waits in the shared-data journal ([`crate::store::journal`]): what the
//! settle script is to apply ([`SettleArgs`]) and what the reservation held, encoded into one journal
//! entry and read back by whichever VM sends the journal.
//!
//! ```text
//! [v=3][mode 's'|'c'][actual u64][reserved u64][expire i64][has_model u8]
//! [len u16][tenant prefix][len u16][used_total key][len u16][used_model key][len u16][request id]
//! ```

use crate::quota::{tenant_tag, QuotaKeys, SettleArgs, SettleMode};
use crate::store::read_u64;

/// What a settlement job sends.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The settlement (or charge).
    pub args: SettleArgs,
    /// What the reservation held (0 for a charge), for the refund / extra-charge counters.
    pub reserved: u64,
}

impl Job {
    /// The journal entry: `[v=3][mode][actual u64][reserved u64][expire i64][has_model]` then the
    /// tenant prefix, the two counter keys and the request id, each `[len u16][bytes]`.
    pub fn encode(&self) -> Vec<u8> {
        let a = &self.args;
        let k = &a.keys;
        let prefix = tenant_tag(k);
        let mut v = Vec::with_capacity(
            28 + prefix.len() + k.used_total.len() + k.used_model.len() + k.request_id.len() + 8,
        );
        v.push(3);
        v.push(match a.mode {
            SettleMode::Settle => b's',
            SettleMode::Charge => b'c',
        });
        v.extend_from_slice(&a.actual.to_le_bytes());
        v.extend_from_slice(&self.reserved.to_le_bytes());
        v.extend_from_slice(&a.expire_at_unix.to_le_bytes());
        v.push(u8::from(k.has_model));
        for s in [prefix, &k.used_total, &k.used_model, &k.request_id] {
            let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
            v.extend_from_slice(&len.to_le_bytes());
            v.extend_from_slice(s.as_bytes().get(..usize::from(len)).unwrap_or_default());
        }
        v
    }

    /// Reads a journal entry; `None` when it is not one of ours.
    pub fn decode(b: &[u8]) -> Option<Job> {
        if b.first() != Some(&3) {
            return None;
        }
        let mode = match b.get(1)? {
            b's' => SettleMode::Settle,
            b'c' => SettleMode::Charge,
            _ => return None,
        };
        let actual = read_u64(b, 2)?;
        let reserved = read_u64(b, 10)?;
        let expire = i64::from_le_bytes(b.get(18..26)?.try_into().ok()?);
        let has_model = *b.get(26)? == 1;
        let mut at = 27usize;
        let mut parts = Vec::with_capacity(4);
        for _ in 0..4 {
            let len = usize::from(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
            at += 2;
            parts.push(std::str::from_utf8(b.get(at..at + len)?).ok()?.to_string());
            at += len;
        }
        let [prefix, used_total, used_model, request_id]: [String; 4] = parts.try_into().ok()?;
        Some(Job {
            args: SettleArgs {
                keys: QuotaKeys::for_settlement(
                    &prefix, used_total, used_model, request_id, has_model,
                ),
                mode,
                actual,
                expire_at_unix: expire,
            },
            reserved,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_survives_the_journal_encoding() {
        for (model, mode) in [
            (Some("gpt-4.1"), SettleMode::Settle),
            (None, SettleMode::Charge),
        ] {
            let mut keys = QuotaKeys::new("a}b{c", model, "2026-11", "rid-1-2-3");
            // A settlement does not need the limit keys: the journal does not keep them.
            keys.limit_override.clear();
            keys.limit_model_override.clear();
            let job = Job {
                args: SettleArgs {
                    keys,
                    mode,
                    actual: u64::MAX,
                    expire_at_unix: -5,
                },
                reserved: 42,
            };
            assert_eq!(Job::decode(&job.encode()), Some(job));
        }
        assert_eq!(Job::decode(b""), None);
        assert_eq!(Job::decode(&[3, b'x']), None);
    }
}
