//! Who is asking: the tenant id of a request, from a claim of a JWT that Envoy verified, a trusted header,
//! an API key (listed, or hashed), or the default — in that order ([`resolve`]), with the checks that
//! apply whichever names the tenant (an unlisted key, two keys, two identities that disagree).
//!
//! A claim is read from Envoy's dynamic metadata as the host hands it over ([`read_claim`]; measured on
//! Envoy 1.40): a string as its bytes, a number as 8 bytes of a little-endian `f64`, a boolean as 1
//! byte, a list or an object as proxy-wasm pairs (`[n u32][n × (key len u32, value len u32)][key NUL
//! value NUL …]`, a list's elements as keys with empty values). The bytes carry no type: a string that
//! is a valid id is taken as it is, and other printable text is a string of the wrong characters;
//! otherwise 8 bytes are read as a number (a whole number up to 2^53 becomes its decimal text), and
//! pairs holding exactly one element as that element; anything else is a claim of the wrong type. The
//! ambiguity left: a whole number from 2^51 whose 8 bytes happen to be printable text (about 1 in 400)
//! is read as that text, and an object of one member whose value is `""` as a list of its key.
//!
//! Raw API keys are never stored, logged or used as shared-data keys: a key becomes
//! `key:<first 16 hex digits of SHA-256(key)>` (64 bits: collisions are negligible for any realistic
//! number of keys, and the digest cannot be reversed into the key).
//!
//! Tenant ids are also cleaned for use in keys and logs: at most 128 bytes of `[A-Za-z0-9._:@-]`;
//! anything else is rejected as no tenant.

use sha2::{Digest, Sha256};
use std::borrow::Cow;

/// Where the tenant came from (for the audit record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantSource {
    /// A claim of a JWT Envoy verified.
    Claim,
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

/// SHA-256 of an API key (what `api_keys` lists, hex-encoded: `printf %s "$KEY" | sha256sum`).
pub fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The tenant id of a key's digest when keys are not listed: `key:<first 16 hex digits>`.
pub fn tenant_of_digest(d: &[u8; 32]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(20);
    out.push_str("key:");
    for b in d.iter().take(8) {
        out.push(char::from(*HEX.get(usize::from(b >> 4)).unwrap_or(&b'0')));
        out.push(char::from(*HEX.get(usize::from(b & 15)).unwrap_or(&b'0')));
    }
    out
}

/// The tenant id for an API key when keys are not listed ([`tenant_of_digest`] of [`key_digest`]).
pub fn tenant_from_key(key: &str) -> String {
    tenant_of_digest(&key_digest(key))
}

/// The API keys an operator listed (`api_keys` in the configuration): SHA-256 digest → tenant.
pub type ApiKeys = std::collections::HashMap<[u8; 32], String, crate::store::hash::FnvBuild>;

/// Parses a key digest as the configuration gives it: 64 hex digits, optionally after `sha256:`.
pub fn parse_digest(s: &str) -> Option<[u8; 32]> {
    let hex = s.strip_prefix("sha256:").unwrap_or(s).as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = hex.get(2 * i..2 * i + 2)?;
        let pair = std::str::from_utf8(pair).ok()?;
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// The digests (and tenant ids, when keys are not listed) of API keys seen recently by this worker, so
/// SHA-256 (its cost: `docs/benchmarks.md`) runs once per key rather than once per request. Entries are
/// found by two independent 64-bit hashes of the key plus its length; the key itself is not kept. At
/// most [`KeyCache::MAX`] entries (cleared when full), each the 24-byte id and the 32-byte digest
/// (about 1.2 MB per worker when full; the tenant id is written from the digest when asked).
#[derive(Default)]
pub struct KeyCache {
    map: std::collections::HashMap<KeyId, [u8; 32], crate::store::hash::FnvBuild>,
}

/// How [`KeyCache`] finds a key without keeping it: two 64-bit hashes and the length.
type KeyId = (u64, u64, usize);

impl KeyCache {
    /// Most cached keys: 10,000 tenants with a key each, cycled, stay cached (with 4,096 every
    /// request of such a rotation computed SHA-256 again, about 9k instructions).
    pub const MAX: usize = 16_384;

    fn entry(&mut self, key: &str) -> &[u8; 32] {
        let a = crate::store::hash::fnv1a(crate::store::hash::FNV_OFFSET, key.as_bytes());
        let b = key
            .as_bytes()
            .iter()
            .fold(0x9e37_79b9_7f4a_7c15u64, |h, &c| {
                (h.rotate_left(5) ^ u64::from(c)).wrapping_mul(0xff51_afd7_ed55_8ccd)
            });
        let id = (a, b, key.len());
        if !self.map.contains_key(&id) && self.map.len() >= Self::MAX {
            self.map.clear();
        }
        self.map.entry(id).or_insert_with(|| key_digest(key))
    }

    /// The tenant id of `key` when keys are not listed ([`tenant_from_key`]), from its cached digest.
    pub fn tenant(&mut self, key: &str) -> String {
        tenant_of_digest(self.entry(key))
    }

    /// The SHA-256 digest of `key`, cached.
    pub fn digest(&mut self, key: &str) -> [u8; 32] {
        *self.entry(key)
    }
}

/// A request with two different API keys, one in `Authorization: Bearer …` and one in `x-api-key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TwoKeys;

/// Extracts an API key from `Authorization: Bearer …` or `x-api-key`. `Err(TwoKeys)` when both carry a
/// key and they differ: the provider checks one of them (OpenAI the bearer token, Anthropic
/// `x-api-key`), so charging the other would let a client name any tenant it likes. Also when one
/// header holds a list of different values (`Bearer k1,Bearer k2`): that is how Envoy passes a header
/// sent twice (it joins the lines of `Authorization` with commas), and the provider may read any of
/// them. No API key has a comma.
pub fn api_key<'a>(
    authorization: Option<&'a str>,
    x_api_key: Option<&'a str>,
) -> Result<Option<&'a str>, TwoKeys> {
    let bearer = bearer(authorization)?;
    let x = match x_api_key {
        Some(x) => one_value(x, Some)?,
        None => None,
    };
    match (bearer, x) {
        (Some(b), Some(x)) if b != x => Err(TwoKeys),
        (b, x) => Ok(b.or(x)),
    }
}

/// The key in a header's value, a comma-separated list of values (empty ones ignored): `key_of` the
/// value when every value is the same, `Err(TwoKeys)` when they differ and one of them is a key.
fn one_value<'a>(
    header: &'a str,
    key_of: impl Fn(&'a str) -> Option<&'a str>,
) -> Result<Option<&'a str>, TwoKeys> {
    let mut values = header.split(',').map(str::trim).filter(|v| !v.is_empty());
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let mut same = true;
    let mut key = key_of(first);
    let first = key.unwrap_or(first);
    for v in values {
        let k = key_of(v);
        same &= k.unwrap_or(v) == first;
        key = key.or(k);
    }
    match key {
        Some(_) if !same => Err(TwoKeys),
        k => Ok(k),
    }
}

/// Where a request's provider reads its credential, by the family of the request's path: the key a
/// tenant comes from is that credential, never a header that provider ignores (which a client could set
/// to any value and so pick its tenant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPlace {
    /// OpenAI-compatible and Anthropic paths: `Authorization: Bearer`, `x-api-key`.
    OpenAi,
    /// Azure OpenAI (`…/openai/deployments/…`, `/openai/v1/…`): `api-key`, `Authorization: Bearer`
    /// (an Entra ID token).
    Azure,
    /// Gemini API and Vertex AI (Claude on Vertex too): `x-goog-api-key`, the `key` query parameter,
    /// `Authorization: Bearer` (an OAuth access token) or the `access_token` query parameter.
    Google,
    /// Bedrock: the access key id of a SigV4 `Authorization` (`AWS4-… Credential=<id>/…`, not the
    /// signature), or a Bedrock API key as `Authorization: Bearer`; a presigned URL's
    /// `X-Amz-Credential`.
    Bedrock,
}

impl KeyPlace {
    /// The place of a metered API: `path_model` when its path names the model (an Azure deployment,
    /// Claude on Vertex AI), `azure_v1` for Azure's `/openai/v1/…` paths.
    pub fn of(
        kind: Option<crate::estimate::ApiKind>,
        path_model: bool,
        azure_v1: bool,
    ) -> KeyPlace {
        use crate::estimate::ApiKind as K;
        match kind {
            Some(
                K::BedrockConverse
                | K::BedrockConverseStream
                | K::BedrockInvoke
                | K::BedrockInvokeStream,
            ) => KeyPlace::Bedrock,
            Some(K::GeminiGenerate | K::GeminiStream) => KeyPlace::Google,
            Some(K::AnthropicMessages) if path_model => KeyPlace::Google,
            Some(K::AnthropicMessages) | None => KeyPlace::OpenAi,
            Some(_) if path_model || azure_v1 => KeyPlace::Azure,
            Some(_) => KeyPlace::OpenAi,
        }
    }

    /// The headers its provider reads a credential from.
    pub fn headers(self) -> &'static [&'static str] {
        match self {
            KeyPlace::OpenAi => &["authorization", "x-api-key"],
            KeyPlace::Azure => &["authorization", "api-key"],
            KeyPlace::Google => &["authorization", "x-goog-api-key"],
            KeyPlace::Bedrock => &["authorization"],
        }
    }
}

/// The credential headers and query string of a request, as [`request_key`] reads them.
#[derive(Clone, Copy, Default)]
pub struct KeyInputs<'a> {
    /// `Authorization`.
    pub authorization: Option<&'a str>,
    /// `x-api-key` (OpenAI-compatible and Anthropic).
    pub x_api_key: Option<&'a str>,
    /// `api-key` (Azure OpenAI).
    pub api_key: Option<&'a str>,
    /// `x-goog-api-key` (Gemini API, Vertex AI express mode).
    pub x_goog_api_key: Option<&'a str>,
    /// The query string (after `?`, without a fragment).
    pub query: Option<&'a str>,
}

/// The key a request's tenant comes from: the credential its provider checks ([`KeyPlace`]), from the
/// places that provider reads; every other credential header is ignored. `Err(TwoKeys)` when the
/// provider's own places hold different credentials (or one place a list of different values): which
/// one the provider uses is not known, so charging one would let a client choose.
pub fn request_key<'a>(
    place: KeyPlace,
    k: &KeyInputs<'a>,
) -> Result<Option<Cow<'a, str>>, TwoKeys> {
    let found: [Option<Cow<'a, str>>; 3] = match place {
        KeyPlace::OpenAi => {
            return api_key(k.authorization, k.x_api_key).map(|v| v.map(Cow::Borrowed));
        }
        KeyPlace::Azure => [
            bearer(k.authorization)?.map(Cow::Borrowed),
            one_key(k.api_key)?.map(Cow::Borrowed),
            None,
        ],
        KeyPlace::Google => [
            bearer(k.authorization)?.map(Cow::Borrowed),
            one_key(k.x_goog_api_key)?.map(Cow::Borrowed),
            query_key(k.query, &["key", "access_token"])?,
        ],
        KeyPlace::Bedrock => [
            aws_authorization(k.authorization)?.map(Cow::Borrowed),
            query_key(k.query, &["x-amz-credential"])?
                .map(|c| match c.split_once('/') {
                    Some((id, _)) => Cow::Owned(id.to_string()),
                    None => c,
                })
                .filter(|id| !id.is_empty()),
            None,
        ],
    };
    let mut key: Option<Cow<'a, str>> = None;
    for f in found.into_iter().flatten() {
        match &key {
            Some(have) if *have != f => return Err(TwoKeys),
            Some(_) => {}
            None => key = Some(f),
        }
    }
    Ok(key)
}

/// The bearer token of an `Authorization` value (a list of different values: two keys).
fn bearer(authorization: Option<&str>) -> Result<Option<&str>, TwoKeys> {
    match authorization {
        Some(a) => one_value(a, |v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| rest.trim())
                .filter(|k| !k.is_empty())
        }),
        None => Ok(None),
    }
}

/// A key header's value (a list of different values: two keys).
fn one_key(header: Option<&str>) -> Result<Option<&str>, TwoKeys> {
    match header {
        Some(h) => one_value(h, Some),
        None => Ok(None),
    }
}

/// Bedrock's `Authorization`: SigV4 (`AWS4-HMAC-SHA256 Credential=<access key id>/<date>/<region>/
/// <service>/aws4_request, SignedHeaders=…, Signature=…`, also SigV4a's `AWS4-ECDSA-P256-SHA256`): the
/// access key id; `Bearer <Bedrock API key>`: the key. The value is a comma-separated list of
/// credentials (each a scheme then its parameters, themselves separated by commas), as Envoy joins a
/// repeated header: different credentials are two keys, as in [`one_value`]. A SigV4 value without a
/// readable `Credential=` names no key.
fn aws_authorization(authorization: Option<&str>) -> Result<Option<&str>, TwoKeys> {
    let Some(value) = authorization else {
        return Ok(None);
    };
    // Each credential: (what it is compared by, its key).
    let mut creds: Vec<(&str, Option<&str>)> = Vec::new();
    let mut aws = false;
    for piece in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, rest) = piece.split_once([' ', '\t']).unwrap_or((piece, ""));
        let param = if first.contains('=') {
            // A parameter of the current credential (`SignedHeaders=…`, `Signature=…`).
            piece
        } else {
            // A new credential: `<scheme> <first parameter or token>`.
            aws = first
                .get(..5)
                .is_some_and(|p| p.eq_ignore_ascii_case("aws4-"));
            let rest = rest.trim();
            let key = if first.eq_ignore_ascii_case("bearer") {
                Some(rest).filter(|k| !k.is_empty())
            } else {
                None
            };
            creds.push((key.unwrap_or(piece), key));
            if !aws {
                continue;
            }
            rest
        };
        if !aws {
            continue;
        }
        let Some((name, v)) = param.split_once('=') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("credential") {
            let id = v.trim().split('/').next().unwrap_or_default();
            if let Some(last) = creds.last_mut().filter(|_| !id.is_empty()) {
                match last.1 {
                    // Two `Credential=` in one SigV4 credential: as two credentials.
                    Some(have) if have != id => return Err(TwoKeys),
                    _ => *last = (id, Some(id)),
                }
            }
        }
    }
    let mut key = None;
    let mut same = true;
    let first = creds.first().map(|c| c.0);
    for (ident, k) in &creds {
        same &= Some(*ident) == first;
        key = key.or(*k);
    }
    match key {
        Some(_) if !same => Err(TwoKeys),
        k => Ok(k),
    }
}

/// The values of query parameters named `names` (ASCII case and percent-encoding of the name ignored;
/// the value percent-decoded, `+` as a space), split at `&` and `;`: different values are two keys. A
/// value that does not decode (a bad escape, not UTF-8) is taken as it is sent.
fn query_key<'a>(query: Option<&'a str>, names: &[&str]) -> Result<Option<Cow<'a, str>>, TwoKeys> {
    let Some(q) = query else {
        return Ok(None);
    };
    let mut key: Option<Cow<'a, str>> = None;
    for pair in q.split(['&', ';']) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode_query(name);
        if !names.iter().any(|n| name.eq_ignore_ascii_case(n)) {
            continue;
        }
        let value = decode_query(value);
        if value.is_empty() {
            continue;
        }
        match &key {
            Some(have) if *have != value => return Err(TwoKeys),
            Some(_) => {}
            None => key = Some(value),
        }
    }
    Ok(key)
}

/// A query string component, percent-decoded and `+` read as a space; as it is when it does not
/// decode.
fn decode_query(s: &str) -> Cow<'_, str> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hex = |at: usize| bytes.get(at).and_then(|c| char::from(*c).to_digit(16));
                let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
                    return Cow::Borrowed(s);
                };
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(0));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    match String::from_utf8(out) {
        Ok(v) => Cow::Owned(v),
        Err(_) => Cow::Borrowed(s),
    }
}

/// A claim as read from Envoy's dynamic metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The verified payload has no such claim (or there is no verified token).
    Missing,
    /// An id: a valid tenant or group id.
    Id(String),
    /// Present, but not an id (wrong type, or characters outside an id's).
    Invalid,
}

/// Reads a claim from the bytes the host gave for its property path (`None`: absent).
pub fn read_claim(bytes: Option<&[u8]>) -> Claim {
    let Some(b) = bytes else {
        return Claim::Missing;
    };
    if let Ok(s) = std::str::from_utf8(b) {
        if valid_tenant(s) {
            return Claim::Id(s.to_string());
        }
        // Printable text that is no id is a string of the wrong characters, whatever its length: 8 such
        // bytes are not read as a number. A whole number's 8 bytes hold a NUL or a control character, or
        // are no UTF-8, below 2^51; from there on about 1 in 400 are printable, and are read as text.
        if !s.is_empty() && !s.chars().any(char::is_control) {
            return Claim::Invalid;
        }
    }
    if let Ok(arr) = <[u8; 8]>::try_from(b) {
        let x = f64::from_le_bytes(arr);
        // A whole number a JSON payload holds exactly (up to 2^53).
        if (0.0..=9_007_199_254_740_992.0).contains(&x) && x.fract() == 0.0 {
            return Claim::Id(format!("{}", x as u64));
        }
        return Claim::Invalid;
    }
    match single_pair_key(b) {
        Some(k) if valid_tenant(k) => Claim::Id(k.to_string()),
        _ => Claim::Invalid,
    }
}

/// The key of proxy-wasm pairs holding exactly one pair with an empty value (a list of one element).
fn single_pair_key(b: &[u8]) -> Option<&str> {
    let u32_at = |at: usize| -> Option<usize> {
        let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(bytes)).ok()
    };
    if u32_at(0)? != 1 || u32_at(8)? != 0 {
        return None;
    }
    let len = u32_at(4)?;
    let key = b.get(12..12 + len)?;
    // The key, its NUL, the empty value's NUL, and nothing else.
    if b.len() != 12 + len + 2 {
        return None;
    }
    std::str::from_utf8(key).ok()
}

/// Who a request is, by the rules of [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// This tenant.
    Tenant(String, TenantSource),
    /// An API key that `api_keys` does not list.
    UnknownKey,
    /// Two different API keys where keys matter.
    TwoKeys,
    /// A listed API key of another tenant than the verified identity's: (the verified tenant, the
    /// key's).
    Conflict(String, String),
    /// Nothing names a tenant (and there is no default).
    Nobody,
}

/// Where a tenant can come from, as configured.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// `api_key_tenants`: keys name tenants.
    pub api_key_tenants: bool,
    /// `api_keys`: only these keys, each naming its tenant (`None`: any key, as `key:<hash>`).
    pub api_keys: Option<&'a ApiKeys>,
    /// `default_tenant`.
    pub default_tenant: Option<&'a str>,
}

/// What a request presents.
#[derive(Clone, Copy)]
pub struct Presented<'a> {
    /// The tenant a verified JWT's claim names (already read, a valid id).
    pub claim: Option<&'a str>,
    /// The trusted header's value (only when `trusted_headers` allows it).
    pub header: Option<&'a str>,
    /// The API key (`Err`: two different keys).
    pub key: Result<Option<&'a str>, TwoKeys>,
}

/// Whether a trusted header's value names a tenant.
pub fn is_tenant_name(header_value: Option<&str>) -> bool {
    header_value.map(str::trim).is_some_and(valid_tenant)
}

/// Resolves the tenant. The verified identity — a JWT claim, else the trusted header — names it when
/// present; else the API key (listed in `api_keys` when that is configured, else hashed); else the
/// default. With `api_keys`, a key is checked whatever names the tenant: an unlisted key, two different
/// keys, or a listed key of another tenant than the verified identity's are refused (the key goes to
/// the provider: it must be one the operator issued, to the tenant who is charged).
pub fn resolve(p: Presented, src: Sources, cache: &mut KeyCache) -> Resolved {
    let verified = p
        .claim
        .map(|c| (c.to_string(), TenantSource::Claim))
        .or_else(|| {
            p.header
                .map(str::trim)
                .filter(|h| valid_tenant(h))
                .map(|h| (h.to_string(), TenantSource::Header))
        });
    if let Some(known) = src.api_keys.filter(|_| src.api_key_tenants) {
        let key = match p.key {
            Err(TwoKeys) => return Resolved::TwoKeys,
            Ok(k) => k,
        };
        if let Some(k) = key {
            let Some(t) = known.get(&cache.digest(k)) else {
                return Resolved::UnknownKey;
            };
            return match verified {
                Some((v, _)) if v != *t => Resolved::Conflict(v, t.clone()),
                Some((v, s)) => Resolved::Tenant(v, s),
                None => Resolved::Tenant(t.clone(), TenantSource::ApiKey),
            };
        }
    }
    if let Some((v, s)) = verified {
        return Resolved::Tenant(v, s);
    }
    if src.api_key_tenants && src.api_keys.is_none() {
        match p.key {
            Err(TwoKeys) => return Resolved::TwoKeys,
            Ok(Some(k)) => return Resolved::Tenant(cache.tenant(k), TenantSource::ApiKey),
            Ok(None) => {}
        }
    }
    match src.default_tenant {
        Some(d) => Resolved::Tenant(d.to_string(), TenantSource::Default),
        None => Resolved::Nobody,
    }
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

    fn src(api_key_tenants: bool, default_tenant: Option<&str>) -> Sources<'_> {
        Sources {
            api_key_tenants,
            api_keys: None,
            default_tenant,
        }
    }

    fn hk<'a>(header: Option<&'a str>, key: Option<&'a str>) -> Presented<'a> {
        Presented {
            claim: None,
            header,
            key: Ok(key),
        }
    }

    fn tenant(r: Resolved) -> Option<(String, TenantSource)> {
        match r {
            Resolved::Tenant(t, s) => Some((t, s)),
            _ => None,
        }
    }

    #[test]
    fn header_tenant_wins_over_api_key() {
        let r = resolve(
            hk(Some("team-a"), Some("sk-1")),
            src(true, None),
            &mut KeyCache::default(),
        );
        assert_eq!(
            tenant(r),
            Some(("team-a".to_string(), TenantSource::Header))
        );
    }

    #[test]
    fn api_keys_become_hashed_tenants_without_the_raw_key() {
        let r = resolve(
            hk(None, Some("sk-secret-123")),
            src(true, None),
            &mut KeyCache::default(),
        );
        let (t, src) = tenant(r).unwrap();
        assert_eq!(src, TenantSource::ApiKey);
        assert!(t.starts_with("key:"));
        assert_eq!(t.len(), 20);
        assert!(!t.contains("secret"));
        assert_ne!(t, tenant_from_key("sk-secret-124"));
        assert_eq!(t, tenant_from_key("sk-secret-123"));
    }

    #[test]
    fn bearer_and_x_api_key_are_both_read() {
        assert_eq!(api_key(Some("Bearer  sk-1 "), None), Ok(Some("sk-1")));
        assert_eq!(api_key(None, Some(" sk-2")), Ok(Some("sk-2")));
        assert_eq!(
            api_key(Some("bearer sk-1"), Some("sk-1 ")),
            Ok(Some("sk-1"))
        );
        assert_eq!(api_key(Some("Basic abc"), Some("sk-2")), Ok(Some("sk-2")));
        assert_eq!(api_key(Some("Bearer "), Some("sk-2")), Ok(Some("sk-2")));
        assert_eq!(api_key(Some("Bearer "), None), Ok(None));
        assert_eq!(api_key(None, None), Ok(None));
        // Two different keys: which one the provider checks depends on the provider.
        assert_eq!(api_key(Some("bearer sk-1"), Some("sk-2")), Err(TwoKeys));
    }

    #[test]
    fn a_header_sent_twice_and_joined_with_a_comma_is_two_keys_unless_the_same() {
        // Envoy joins two `Authorization` lines into one value (bb13: charged to a third tenant).
        assert_eq!(api_key(Some("Bearer k,Bearer k2"), None), Err(TwoKeys));
        assert_eq!(api_key(Some("Bearer k, Basic abc"), None), Err(TwoKeys));
        assert_eq!(api_key(None, Some("sk-1, sk-2")), Err(TwoKeys));
        assert_eq!(api_key(Some("Bearer k,Bearer k"), None), Ok(Some("k")));
        assert_eq!(api_key(Some("Bearer k, bearer  k"), None), Ok(Some("k")));
        assert_eq!(api_key(Some("Bearer k, "), None), Ok(Some("k")));
        assert_eq!(api_key(None, Some("sk-1,sk-1")), Ok(Some("sk-1")));
        assert_eq!(api_key(Some(" , "), Some("sk-2")), Ok(Some("sk-2")));
        // No bearer key among them: nothing to charge, nothing refused (the `x-api-key` is the key).
        assert_eq!(
            api_key(Some("Basic abc, Digest x=1"), Some("sk-2")),
            Ok(Some("sk-2"))
        );
    }

    #[test]
    fn invalid_header_tenant_falls_through_to_default() {
        let long = "a".repeat(200);
        let mut c = KeyCache::default();
        assert_eq!(
            tenant(resolve(
                hk(Some(&long), None),
                src(true, Some("anon")),
                &mut c
            ))
            .unwrap()
            .1,
            TenantSource::Default
        );
        assert_eq!(
            resolve(hk(Some("bad tenant"), None), src(true, None), &mut c),
            Resolved::Nobody
        );
    }

    #[test]
    fn api_key_tenants_can_be_disabled() {
        assert_eq!(
            resolve(
                hk(None, Some("sk")),
                src(false, None),
                &mut KeyCache::default()
            ),
            Resolved::Nobody
        );
    }

    #[test]
    fn listed_keys_name_their_tenant_and_any_other_key_is_unknown() {
        let mut known = ApiKeys::default();
        known.insert(key_digest("sk-alice"), "alice".to_string());
        let s = Sources {
            api_key_tenants: true,
            api_keys: Some(&known),
            default_tenant: Some("anon"),
        };
        let mut c = KeyCache::default();
        assert_eq!(
            resolve(hk(None, Some("sk-alice")), s, &mut c),
            Resolved::Tenant("alice".into(), TenantSource::ApiKey)
        );
        // A made-up key is not a new tenant (nor the default).
        assert_eq!(
            resolve(hk(None, Some("sk-random-1")), s, &mut c),
            Resolved::UnknownKey
        );
    }

    #[test]
    fn a_verified_claim_names_the_tenant_and_a_listed_key_must_agree_with_it() {
        let mut known = ApiKeys::default();
        known.insert(key_digest("sk-alice"), "alice".to_string());
        let listed = Sources {
            api_key_tenants: true,
            api_keys: Some(&known),
            default_tenant: None,
        };
        let hashed = src(true, None);
        let mut c = KeyCache::default();
        let with = |claim, key| Presented {
            claim,
            header: None,
            key,
        };
        // The claim wins over a hashed key, and over the trusted header.
        assert_eq!(
            resolve(with(Some("acme"), Ok(Some("sk-x"))), hashed, &mut c),
            Resolved::Tenant("acme".into(), TenantSource::Claim)
        );
        let both = Presented {
            claim: Some("acme"),
            header: Some("other"),
            key: Ok(None),
        };
        assert_eq!(
            resolve(both, hashed, &mut c),
            Resolved::Tenant("acme".into(), TenantSource::Claim)
        );
        // With api_keys: an unlisted key is refused even next to a verified token (it is what the
        // provider is sent), as are two keys and a listed key of another tenant.
        assert_eq!(
            resolve(with(Some("acme"), Ok(Some("sk-x"))), listed, &mut c),
            Resolved::UnknownKey
        );
        assert_eq!(
            resolve(with(Some("acme"), Err(TwoKeys)), listed, &mut c),
            Resolved::TwoKeys
        );
        assert_eq!(
            resolve(with(Some("acme"), Ok(Some("sk-alice"))), listed, &mut c),
            Resolved::Conflict("acme".into(), "alice".into())
        );
        assert_eq!(
            resolve(with(Some("alice"), Ok(Some("sk-alice"))), listed, &mut c),
            Resolved::Tenant("alice".into(), TenantSource::Claim)
        );
        assert_eq!(
            resolve(with(Some("acme"), Ok(None)), listed, &mut c),
            Resolved::Tenant("acme".into(), TenantSource::Claim)
        );
        // Two keys with hashed keys only matter where the key would name the tenant.
        assert_eq!(
            resolve(with(Some("acme"), Err(TwoKeys)), hashed, &mut c),
            Resolved::Tenant("acme".into(), TenantSource::Claim)
        );
        assert_eq!(
            resolve(with(None, Err(TwoKeys)), hashed, &mut c),
            Resolved::TwoKeys
        );
    }

    #[test]
    fn odd_credentials_never_panic_and_name_a_key_only_where_the_provider_reads_one() {
        let huge = "k".repeat(100_000);
        let huge_q = format!("key={huge}&{}", "key=k&".repeat(10_000));
        let sig = "AWS4-HMAC-SHA256 Credential=AKID/20261207/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=00";
        let odd = [
            "",
            " ",
            ",",
            ",,,",
            "=",
            "Credential=",
            "AWS4-HMAC-SHA256",
            "AWS4-HMAC-SHA256 ",
            "AWS4-HMAC-SHA256 Credential=",
            "AWS4-HMAC-SHA256 Credential=/x/y",
            "AWS4- Credential=é/ü",
            "AWS4-HMAC-SHA256 Credential",
            "aws4-hmac-sha256 credential=ak/1",
            "Bearer",
            "Bearer ",
            "Bearer é",
            "key=%",
            "key=%zz",
            "key=%ff%fe",
            "%",
            "&&&;;",
            "key",
            "=k",
            "key==",
            "ключ=к",
            "key=a%2",
            "x-amz-credential=%2F",
            "access_token=t&key=t",
            sig,
            huge.as_str(),
            huge_q.as_str(),
        ];
        for place in [
            KeyPlace::OpenAi,
            KeyPlace::Azure,
            KeyPlace::Google,
            KeyPlace::Bedrock,
        ] {
            for a in odd {
                for b in odd.iter().take(8) {
                    let k = KeyInputs {
                        authorization: Some(a),
                        x_api_key: Some(b),
                        api_key: Some(b),
                        x_goog_api_key: Some(b),
                        query: Some(a),
                    };
                    let _ = request_key(place, &k);
                }
            }
        }
        fn q(query: &str) -> KeyInputs<'_> {
            KeyInputs {
                query: Some(query),
                ..KeyInputs::default()
            }
        }
        let g =
            |query: &str| request_key(KeyPlace::Google, &q(query)).map(|k| k.map(Cow::into_owned));
        assert_eq!(g("key=a%2"), Ok(Some("a%2".into())));
        assert_eq!(g("key=%ff"), Ok(Some("%ff".into())));
        assert_eq!(g("key=k%20"), Ok(Some("k ".into())));
        assert_eq!(g("key=&key=k"), Ok(Some("k".into())));
        assert_eq!(g("alt=sse&Key=k&KEY=%6B"), Ok(Some("k".into())));
        assert_eq!(g("key=k&key=j"), Err(TwoKeys));
        assert_eq!(g(&huge_q), Err(TwoKeys));
        assert_eq!(g("keys=a&apikey=b&key"), Ok(None));
        let aws = |a: &str| {
            request_key(
                KeyPlace::Bedrock,
                &KeyInputs {
                    authorization: Some(a),
                    ..KeyInputs::default()
                },
            )
            .map(|k| k.map(Cow::into_owned))
        };
        assert_eq!(aws(sig), Ok(Some("AKID".into())));
        assert_eq!(aws("AWS4-HMAC-SHA256 Credential=/x/y"), Ok(None));
        assert_eq!(aws("AWS4-HMAC-SHA256 Credential=é/ü"), Ok(Some("é".into())));
        assert_eq!(aws("Credential=AKID/x"), Ok(None));
        assert_eq!(aws("Basic abc"), Ok(None));
        assert_eq!(aws(&format!("{sig}, Basic abc")), Err(TwoKeys));
        assert_eq!(aws(&format!("{sig},{sig}")), Ok(Some("AKID".into())));
        // The query is not Bedrock's key place unless it is a presigned credential.
        assert_eq!(request_key(KeyPlace::Bedrock, &q("key=k")), Ok(None));
        assert_eq!(
            request_key(KeyPlace::Bedrock, &q("X-Amz-Credential=AKID%2Fx"))
                .map(|k| k.map(Cow::into_owned)),
            Ok(Some("AKID".into()))
        );
        assert_eq!(request_key(KeyPlace::Azure, &q("key=k")), Ok(None));
    }

    #[test]
    fn claims_are_read_as_envoy_hands_them_over() {
        // Bytes measured on Envoy 1.40 (jwt_authn payload_in_metadata, a wasm filter's get_property).
        assert_eq!(read_claim(None), Claim::Missing);
        assert_eq!(read_claim(Some(b"acme")), Claim::Id("acme".into()));
        // 5 and 1.5 as JSON numbers: 8 bytes of a little-endian f64.
        assert_eq!(read_claim(Some(&5f64.to_le_bytes())), Claim::Id("5".into()));
        assert_eq!(
            read_claim(Some(&12_345_678_901_234f64.to_le_bytes())),
            Claim::Id("12345678901234".into())
        );
        assert_eq!(read_claim(Some(&1.5f64.to_le_bytes())), Claim::Invalid);
        assert_eq!(read_claim(Some(&(-3f64).to_le_bytes())), Claim::Invalid);
        assert_eq!(read_claim(Some(&1e300f64.to_le_bytes())), Claim::Invalid);
        // true: one byte.
        assert_eq!(read_claim(Some(&[1])), Claim::Invalid);
        // ["g1", "g2"] and ["g1"] as pairs; {"team": "eng"} as pairs.
        let two = [
            2, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, b'g', b'1', 0, 0, b'g',
            b'2', 0, 0,
        ];
        assert_eq!(read_claim(Some(&two)), Claim::Invalid);
        let one = [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, b'g', b'1', 0, 0];
        assert_eq!(read_claim(Some(&one)), Claim::Id("g1".into()));
        let object = [
            1, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, b't', b'e', b'a', b'm', 0, b'e', b'n', b'g', 0,
        ];
        assert_eq!(read_claim(Some(&object)), Claim::Invalid);
        // A string that is no id: spaces, too long, empty.
        assert_eq!(read_claim(Some(b"Acme Corp")), Claim::Invalid);
        assert_eq!(read_claim(Some(&[b'a'; 129])), Claim::Invalid);
        assert_eq!(read_claim(Some(b"")), Claim::Invalid);
        // Text that is no id is refused whatever its length: read as a double, these 8 bytes are the
        // whole number 5946584628076641 (they were charged as that tenant).
        assert_eq!(read_claim(Some(b"a b c 5C")), Claim::Invalid);
        // The other way round: a whole number whose 8 bytes are printable text is that text (from
        // 2^51 up, about 1 in 400 numbers): an id when the text is one, else refused.
        assert_eq!(
            read_claim(Some(&5_460_610_219_467_361f64.to_le_bytes())),
            Claim::Id("abcdef3C".into())
        );
        assert_eq!(
            read_claim(Some(&5_947_783_412_001_656f64.to_le_bytes())),
            Claim::Invalid
        );
        assert_eq!(
            read_claim(Some(&2_251_799_813_685_248f64.to_le_bytes())),
            Claim::Id("2251799813685248".into())
        );
    }

    #[test]
    fn digests_parse_from_hex_with_or_without_the_prefix() {
        let d = key_digest("abc");
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_digest(&hex), Some(d));
        assert_eq!(parse_digest(&format!("sha256:{hex}")), Some(d));
        assert_eq!(parse_digest(&hex[1..]), None);
        assert_eq!(parse_digest(&format!("{}zz", &hex[2..])), None);
        assert_eq!(tenant_from_key("abc"), format!("key:{}", &hex[..16]));
    }
}
