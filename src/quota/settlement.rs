//! A quota settlement as it waits in the shared-data journal ([`crate::store::journal`]): what the
//! settle script is to apply ([`SettleArgs`]) and what the reservation held, encoded into one journal
//! entry and read back by whichever VM sends the journal.
//!
//! ```text
//! [v=3][mode 's'|'c'][actual u64][reserved u64][expire i64][has_model u8]
//! [len u16][tenant prefix][len u16][used_total key][len u16][used_model key][len u16][request id]
//! [tokens_in u64][tokens_out u64]                       (since 0.2.0, optional)
//! ```
//!
//! The input/output trailer was appended to layout v3 without a new version byte: a decoder of 0.1.x
//! reads the four strings and ignores what follows, so during a reload an old VM still sends a new
//! entry (its weighted amount whole, its split lost); an entry without the trailer (written by an old
//! VM) reads as 0 input and 0 output tokens (nothing added to the split).

use crate::quota::{tenant_tag, QuotaKeys, SettleArgs, SettleMode};
use crate::shim::webdis::{parse_int_array, ShimError};
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
    /// tenant prefix, the two counter keys and the request id, each `[len u16][bytes]`, then
    /// `[tokens_in u64][tokens_out u64]`.
    pub fn encode(&self) -> Vec<u8> {
        let a = &self.args;
        let k = &a.keys;
        let prefix = tenant_tag(k);
        let mut v = Vec::with_capacity(
            28 + prefix.len() + k.used_total.len() + k.used_model.len() + k.request_id.len() + 24,
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
        v.extend_from_slice(&a.tokens_in.to_le_bytes());
        v.extend_from_slice(&a.tokens_out.to_le_bytes());
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
        // The input/output trailer: absent in an entry of 0.1.x (nothing to add to the split).
        let (tokens_in, tokens_out) = match (read_u64(b, at), read_u64(b, at + 8)) {
            (Some(i), Some(o)) => (i, o),
            _ => (0, 0),
        };
        Some(Job {
            args: SettleArgs {
                keys: QuotaKeys::for_settlement(
                    &prefix, used_total, used_model, request_id, has_model,
                ),
                mode,
                actual,
                expire_at_unix: expire,
                tokens_in,
                tokens_out,
            },
            reserved,
        })
    }
}

/// What Redis did with one tenant group of a settlement batch call
/// ([`SETTLE_BATCH_SCRIPT`](crate::quota::scripts::SETTLE_BATCH_SCRIPT)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupOutcome {
    /// The group ran: the settlement script's flag per entry (1 applied, 0 nothing to do, −1 a
    /// counter is not a number or the entry is malformed).
    Ran(Vec<i64>),
    /// The script refused the group's arguments: nothing of it ran.
    Refused,
    /// Redis failed while the group ran (a key of the wrong type, say): it may have written part of it.
    Failed,
}

/// Reads a settlement batch's reply: `Err` for the call as a whole (the shim, Redis or the script's own
/// checks refused it: nothing of it is known), else one outcome per group of `sizes` entries, in order.
pub fn parse_settle_batch_reply(
    http_status: u32,
    body: &[u8],
    sizes: &[usize],
) -> Result<Vec<GroupOutcome>, ShimError> {
    let n: usize = sizes.iter().sum();
    let v = parse_int_array(http_status, body, n)?;
    let mut out = Vec::with_capacity(sizes.len());
    let mut rest = v.as_slice();
    for &m in sizes {
        let (g, r) = rest.split_at(m.min(rest.len()));
        rest = r;
        let outcome = match g.first() {
            Some(-2) if g.iter().all(|x| *x == -2) => GroupOutcome::Refused,
            Some(-3) if g.iter().all(|x| *x == -3) => GroupOutcome::Failed,
            _ if g.iter().all(|x| (-1..=1).contains(x)) => GroupOutcome::Ran(g.to_vec()),
            _ => return Err(ShimError::Garbage("batch entry out of range".into())),
        };
        out.push(outcome);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_reply_is_read_per_group() {
        let body = br#"{"EVALSHA":[1,0,-2,-2,-3,-1,1]}"#;
        assert_eq!(
            parse_settle_batch_reply(200, body, &[2, 2, 1, 2]),
            Ok(vec![
                GroupOutcome::Ran(vec![1, 0]),
                GroupOutcome::Refused,
                GroupOutcome::Failed,
                GroupOutcome::Ran(vec![-1, 1]),
            ])
        );
        // A group half refused, a value out of range, or the wrong count: garbage.
        for (body, sizes) in [
            (&br#"{"EVALSHA":[1,-2]}"#[..], &[2][..]),
            (br#"{"EVALSHA":[2]}"#, &[1]),
            (br#"{"EVALSHA":[1,1]}"#, &[1]),
        ] {
            assert!(matches!(
                parse_settle_batch_reply(200, body, sizes),
                Err(ShimError::Garbage(_))
            ));
        }
        assert_eq!(
            parse_settle_batch_reply(200, br#"{"EVALSHA":[false,"NOSCRIPT x"]}"#, &[1]),
            Err(ShimError::NoScript)
        );
    }

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
                    tokens_in: 1234,
                    tokens_out: u64::MAX,
                },
                reserved: 42,
            };
            assert_eq!(Job::decode(&job.encode()), Some(job));
        }
        assert_eq!(Job::decode(b""), None);
        assert_eq!(Job::decode(&[3, b'x']), None);
    }

    fn job(tokens_in: u64, tokens_out: u64) -> Job {
        Job {
            args: SettleArgs {
                keys: QuotaKeys::for_settlement(
                    "tg:q:{acme}",
                    "tg:q:{acme}:2026-12".into(),
                    "tg:q:{acme}:2026-12:m:gpt-4.1".into(),
                    "rid-9".into(),
                    true,
                ),
                mode: SettleMode::Settle,
                actual: 900,
                expire_at_unix: 1_800_000_000,
                tokens_in,
                tokens_out,
            },
            reserved: 1000,
        }
    }

    /// The v3 decoder of 0.1.x, as it was (the four strings, nothing after them read).
    fn decode_0_1(b: &[u8]) -> Option<(u8, u64, u64, i64, bool, [String; 4])> {
        if b.first() != Some(&3) {
            return None;
        }
        let mode = *b.get(1)?;
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
        Some((
            mode,
            actual,
            reserved,
            expire,
            has_model,
            parts.try_into().ok()?,
        ))
    }

    #[test]
    fn an_entry_with_the_split_is_read_by_the_old_decoder_and_an_old_entry_by_the_new_one() {
        let new = job(700, 80).encode();
        // 0.1.x reads the new entry whole, the trailer ignored.
        let (mode, actual, reserved, _, has_model, parts) = decode_0_1(&new).unwrap();
        assert_eq!((mode, actual, reserved, has_model), (b's', 900, 1000, true));
        assert_eq!(parts[3], "rid-9");
        // An entry 0.1.x wrote (no trailer) reads with no split: nothing to add.
        let old = &new[..new.len() - 16];
        assert_eq!(decode_0_1(old), decode_0_1(&new));
        assert_eq!(Job::decode(old), Some(job(0, 0)));
        // A cut trailer is no split either, never garbage numbers.
        assert_eq!(Job::decode(&new[..new.len() - 3]), Some(job(0, 0)));
        assert_eq!(Job::decode(&new), Some(job(700, 80)));
    }
}
