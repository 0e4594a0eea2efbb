//! Who is asking: the tenant id of a request, from a configured header or from a hashed API key.
//!
//! Raw API keys are never stored, logged or used as shared-data keys: a key becomes
//! `key:<first 16 hex digits of SHA-256(key)>` (64 bits: collisions are negligible for any realistic
//! number of keys, and the digest cannot be reversed into the key).
//!
//! Tenant ids are also cleaned for use in keys and logs: at most 128 bytes of `[A-Za-z0-9._:@-]`;
//! anything else is rejected as no tenant.

use sha2::{Digest, Sha256};

/// Where the tenant came from (for the audit record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantSource {
    /// The configured tenant header.
    Header,
    /// A hashed API key.
    ApiKey,
    /// The configured default tenant.
    Default,
}

/// Longest accepted tenant id.
pub const MAX_TENANT_LEN: usize = 128;

/// True when `t` is a usable tenant id.
pub fn valid_tenant(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= MAX_TENANT_LEN
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'))
}

/// The tenant id for an API key.
pub fn tenant_from_key(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let mut out = String::with_capacity(20);
    out.push_str("key:");
    for b in digest.iter().take(8) {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Tenant ids of API keys seen recently by this worker, so SHA-256 (its cost: `docs/benchmarks.md`) runs
/// once per key rather than once per request. Entries are found by two independent 64-bit hashes of
/// the key plus its length; the key itself is not kept. At most [`KeyCache::MAX`] entries (cleared
/// when full).
#[derive(Default)]
pub struct KeyCache {
    map: std::collections::HashMap<(u64, u64, usize), String, crate::hash::FnvBuild>,
}

impl KeyCache {
    /// Most cached keys.
    pub const MAX: usize = 4096;

    /// The tenant id of `key` ([`tenant_from_key`]), cached.
    pub fn tenant(&mut self, key: &str) -> String {
        let a = crate::hash::fnv1a(crate::hash::FNV_OFFSET, key.as_bytes());
        let b = key
            .as_bytes()
            .iter()
            .fold(0x9e37_79b9_7f4a_7c15u64, |h, &c| {
                (h.rotate_left(5) ^ u64::from(c)).wrapping_mul(0xff51_afd7_ed55_8ccd)
            });
        let id = (a, b, key.len());
        if let Some(t) = self.map.get(&id) {
            return t.clone();
        }
        let t = tenant_from_key(key);
        if self.map.len() >= Self::MAX {
            self.map.clear();
        }
        self.map.insert(id, t.clone());
        t
    }
}

/// Extracts an API key from `Authorization: Bearer …` or `x-api-key`.
pub fn api_key<'a>(authorization: Option<&'a str>, x_api_key: Option<&'a str>) -> Option<&'a str> {
    let bearer = authorization.and_then(|a| {
        let a = a.trim();
        let (scheme, rest) = a.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| rest.trim())
            .filter(|k| !k.is_empty())
    });
    bearer.or_else(|| x_api_key.map(str::trim).filter(|k| !k.is_empty()))
}

/// Resolves the tenant: header (if valid) → hashed API key (if enabled) → default.
pub fn resolve(
    header_value: Option<&str>,
    key: Option<&str>,
    api_key_tenants: bool,
    default_tenant: Option<&str>,
) -> Option<(String, TenantSource)> {
    resolve_with(
        header_value,
        key,
        api_key_tenants,
        default_tenant,
        tenant_from_key,
    )
}

/// [`resolve`] with the key-to-tenant function given (a [`KeyCache`] in the filter).
pub fn resolve_with(
    header_value: Option<&str>,
    key: Option<&str>,
    api_key_tenants: bool,
    default_tenant: Option<&str>,
    key_tenant: impl FnOnce(&str) -> String,
) -> Option<(String, TenantSource)> {
    if let Some(h) = header_value.map(str::trim).filter(|h| valid_tenant(h)) {
        return Some((h.to_string(), TenantSource::Header));
    }
    if api_key_tenants {
        if let Some(k) = key {
            return Some((key_tenant(k), TenantSource::ApiKey));
        }
    }
    default_tenant.map(|d| (d.to_string(), TenantSource::Default))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_cache_gives_the_uncached_tenant_and_stays_bounded() {
        let mut c = KeyCache::default();
        for i in 0..(KeyCache::MAX + 10) {
            let k = format!("sk-{i}");
            assert_eq!(c.tenant(&k), tenant_from_key(&k));
            assert_eq!(c.tenant(&k), tenant_from_key(&k));
            assert!(c.map.len() <= KeyCache::MAX);
        }
        assert_ne!(c.tenant("sk-a"), c.tenant("sk-b"));
    }

    #[test]
    fn header_tenant_wins_over_api_key() {
        let r = resolve(Some("team-a"), Some("sk-1"), true, None).unwrap();
        assert_eq!(r, ("team-a".to_string(), TenantSource::Header));
    }

    #[test]
    fn api_keys_become_hashed_tenants_without_the_raw_key() {
        let (t, src) = resolve(None, Some("sk-secret-123"), true, None).unwrap();
        assert_eq!(src, TenantSource::ApiKey);
        assert!(t.starts_with("key:"));
        assert_eq!(t.len(), 20);
        assert!(!t.contains("secret"));
        assert_ne!(t, tenant_from_key("sk-secret-124"));
        assert_eq!(t, tenant_from_key("sk-secret-123"));
    }

    #[test]
    fn bearer_and_x_api_key_are_both_read() {
        assert_eq!(api_key(Some("Bearer  sk-1 "), None), Some("sk-1"));
        assert_eq!(api_key(Some("bearer sk-1"), Some("sk-2")), Some("sk-1"));
        assert_eq!(api_key(Some("Basic abc"), Some("sk-2")), Some("sk-2"));
        assert_eq!(api_key(Some("Bearer "), None), None);
        assert_eq!(api_key(None, None), None);
    }

    #[test]
    fn invalid_header_tenant_falls_through_to_default() {
        let long = "a".repeat(200);
        assert_eq!(
            resolve(Some(&long), None, true, Some("anon")).unwrap().1,
            TenantSource::Default
        );
        assert_eq!(resolve(Some("bad tenant"), None, true, None), None);
    }

    #[test]
    fn api_key_tenants_can_be_disabled() {
        assert_eq!(resolve(None, Some("sk"), false, None), None);
    }
}
