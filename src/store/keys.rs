//! Every key the filter writes, named in one place: the prefixes of Envoy shared-data keys and of Redis
//! keys, and the sanitizer that makes a tenant, model or id safe inside a Redis key.
//!
//! ```text
//! shared data (one Envoy, every worker)        Redis (every Envoy, through Webdis)
//! tg:b:<rule>:<tenant>[:<model>]  bucket       tg:q:{<tenant>}:<month>[:m:<model>]  quota counters
//! tg:b:<rule>:~overflow<N>        overflow     tg:q:{<tenant>}:limit[:m:<model>]    limit overrides
//! tg:cb:<scope>=<name>            breaker      tg:q:{<tenant>}:idem:<key>           idempotency record
//! tg:open:breakers                not CLOSED   tg:q:{<tenant>}:settled:<id>         settlement marker
//! tg:q:x:<tenant>                 exhausted    tg:q:{<tenant>}:req:<id>             reservation record
//! tg:gx:<slot>                    refusals     tg:gb:{<rule>:<tenant>}[:<model>]    global bucket
//! tg:n:buckets / breakers / markers  counts
//! tg:gl:a:<global bucket key>     lease
//! tg:gl:i:<n>, tg:n:gleases       lease registry
//! tg:if:<limit>:<subject>         in flight
//! ```
//!
//! Shared data never evicts a key, so every family on the left is bounded by its builder: buckets by
//! `max_tenants` (then overflow buckets), breakers by `breaker.max_keys`, exhausted markers by
//! `max_tenants` on their own count, refusal slots by [`crate::global::SEEN_SLOTS`], global-bucket lease
//! accounts by `max_tenants` on their own count ([`crate::global::lease`]), in-flight semaphores with the bucket
//! keys; `tg:open:breakers` is one key, whose value names at most `breaker.max_keys` breakers. The `tg:n:*` keys
//! hold those counts. Redis keys expire (month end + grace, idempotency window, marker TTL, bucket refill
//! time), and their `{…}` hash tag keeps one tenant's quota keys (one rule × tenant's bucket) on one
//! Redis Cluster slot.
//!
//! Builders: [`crate::limits::local::plain_key`] and [`crate::limits::local::bucket_key`], [`crate::breaker::key`],
//! [`crate::quota::QuotaKeys`] and [`crate::quota::ExhaustedMarker::key`], [`crate::global::key`] and
//! [`crate::global::seen_slot`]. Parts of Redis keys go through [`sanitize`]:
//! ```
//! # use tokengate::store::keys::sanitize;
//! assert_eq!(sanitize("acme"), "acme");
//! assert_eq!(sanitize("a}b{c/d"), "a%7Db%7Bc%2Fd"); // the hash tag stays the tenant's
//! assert_eq!(sanitize(""), "~");
//! ```

/// Shared data: a rule's token bucket, `tg:b:<rule>:<tenant>[:<model>]`, or one of its overflow
/// buckets `tg:b:<rule>:~overflow<N>`.
pub const BUCKET: &str = "tg:b:";
/// Shared data: a circuit breaker, `tg:cb:<scope>=<name>` (scopes `cluster`, `model`, `shim`).
pub const BREAKER: &str = "tg:cb:";
/// Shared data: the request breakers that are not CLOSED, one value for all of them (see
/// [`crate::breaker::OPEN_SET_KEY`]).
pub const BREAKER_OPEN_SET: &str = "tg:open:breakers";
/// Shared data: a tenant's quota-exhausted marker, `tg:q:x:<sanitized tenant>` (never clashes with the
/// Redis quota keys: those continue with `{`, and live in another store anyway).
pub const QUOTA_EXHAUSTED: &str = "tg:q:x:";
/// Shared data: one slot of the global buckets' refusal cache, `tg:gx:<n>`.
pub const GLOBAL_SEEN: &str = "tg:gx:";
/// Shared data: requests in flight of a limit, `tg:if:<limit>:<subject>` (see [`crate::limits::inflight`]).
pub const IN_FLIGHT: &str = "tg:if:";
/// Shared data: how many bucket keys were created (bounded by `max_tenants`).
pub const BUCKET_COUNTER: &str = "tg:n:buckets";
/// Shared data: how many breaker keys were created (bounded by `breaker.max_keys`).
pub const BREAKER_COUNTER: &str = "tg:n:breakers";
/// Shared data: how many quota-exhausted markers were created (bounded by `max_tenants`).
pub const MARKER_COUNTER: &str = "tg:n:markers";
/// Redis: every quota key of a tenant, `tg:q:{<tenant>}:…` (see [`crate::quota::QuotaKeys`]).
pub const QUOTA: &str = "tg:q:";
/// Redis: a global bucket, `tg:gb:{<rule>:<tenant>}[:<model>]`.
pub const GLOBAL_BUCKET: &str = "tg:gb:";

/// Longest sanitized tenant/model/key part; longer values are cut and suffixed with `~<16 hex>`.
pub const MAX_PART_LEN: usize = 128;

/// [`sanitize`] without a copy when `raw` is already safe and short enough (the usual model name).
pub fn sanitized(raw: &str) -> std::borrow::Cow<'_, str> {
    if !raw.is_empty() && raw.len() <= MAX_PART_LEN && raw.bytes().all(is_key_safe) {
        std::borrow::Cow::Borrowed(raw)
    } else {
        std::borrow::Cow::Owned(sanitize(raw))
    }
}

/// Makes `raw` safe inside a key: `[A-Za-z0-9._:-]` kept, any other byte as `%XX` (so `{`, `}` and `%`
/// can never appear raw and the hash tag stays the tenant). The result is at most [`MAX_PART_LEN`]
/// bytes: a longer one keeps its first bytes and ends with `~` plus the FNV-1a-64 of the whole raw value
/// (`~` never appears otherwise, so cut values cannot collide with short ones). Empty → `~`.
pub fn sanitize(raw: &str) -> String {
    if raw.is_empty() {
        return "~".to_string();
    }
    let full = encode_key_part(raw, usize::MAX);
    if full.len() <= MAX_PART_LEN {
        return full;
    }
    let mut short = encode_key_part(raw, MAX_PART_LEN - 17);
    short.push('~');
    short.push_str(&format!(
        "{:016x}",
        crate::store::hash::fnv1a(crate::store::hash::FNV_OFFSET, raw.as_bytes())
    ));
    short
}

/// Encodes `raw` for a key, stopping before the output would exceed `max` bytes (never splitting `%XX`).
fn encode_key_part(raw: &str, max: usize) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_PART_LEN));
    for b in raw.bytes() {
        let safe = is_key_safe(b);
        if out.len().saturating_add(if safe { 1 } else { 3 }) > max {
            break;
        }
        if safe {
            out.push(char::from(b));
        } else {
            crate::shim::webdis::push_percent(&mut out, b);
        }
    }
    out
}

fn is_key_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_parts_are_encoded_as_the_readme_tells_operators() {
        // What `tokengate usage` and the other CLI commands encode (cli/: they call this function).
        for (raw, key) in [
            ("alice@example.com", "alice%40example.com"),
            ("meta-llama/Llama-3.1-8B", "meta-llama%2FLlama-3.1-8B"),
            ("~b:x:été", "%7Eb:x:%C3%A9t%C3%A9"),
            ("team_a.b-c", "team_a.b-c"),
        ] {
            assert_eq!(sanitize(raw), key);
        }
    }

    #[test]
    fn no_shared_data_prefix_is_the_start_of_another() {
        let shared = [
            BUCKET,
            BREAKER,
            QUOTA_EXHAUSTED,
            GLOBAL_SEEN,
            BUCKET_COUNTER,
            BREAKER_COUNTER,
            MARKER_COUNTER,
            BREAKER_OPEN_SET,
        ];
        for (i, a) in shared.iter().enumerate() {
            assert!(a.starts_with("tg:"), "{a}");
            for (j, b) in shared.iter().enumerate() {
                assert!(i == j || !b.starts_with(a), "{a} starts {b}");
            }
        }
        for redis in [QUOTA, GLOBAL_BUCKET] {
            assert!(redis.starts_with("tg:") && redis.ends_with(':'), "{redis}");
        }
    }

    #[test]
    fn sanitized_borrows_exactly_when_sanitize_would_not_change_the_value() {
        let long = "m".repeat(300);
        for raw in ["gpt-4.1", "key:abc", "a b", "é", "", "x/y", long.as_str()] {
            let s = sanitized(raw);
            assert_eq!(s, sanitize(raw), "{raw}");
            assert_eq!(
                matches!(s, std::borrow::Cow::Borrowed(_)),
                s == raw,
                "{raw}"
            );
        }
    }

    #[test]
    fn sanitize_keeps_safe_characters_and_percent_encodes_the_rest() {
        assert_eq!(sanitize("key:abc-1.2_x"), "key:abc-1.2_x");
        assert_eq!(sanitize("a{b}c/d e%"), "a%7Bb%7Dc%2Fd%20e%25");
        assert_eq!(sanitize("é"), "%C3%A9");
        assert_eq!(sanitize(""), "~");
    }

    #[test]
    fn sanitize_bounds_long_values_and_keeps_them_distinct() {
        let a = "x".repeat(500);
        let b = format!("{}y", "x".repeat(499));
        let (sa, sb) = (sanitize(&a), sanitize(&b));
        assert!(sa.len() <= MAX_PART_LEN && sb.len() <= MAX_PART_LEN);
        assert_ne!(sa, sb);
        assert!(sa.contains('~'));
        let u = "€".repeat(200);
        let su = sanitize(&u);
        assert!(su.len() <= MAX_PART_LEN);
        let prefix = su.split('~').next().unwrap();
        assert_eq!(prefix.len() % 3, 0, "no %XX triple is split: {su}");
        assert_eq!(
            sanitize(&"y".repeat(MAX_PART_LEN)),
            "y".repeat(MAX_PART_LEN)
        );
    }
}
