//! HS256 test tokens for the `jwt_authn` provider of the shipped `envoy/envoy.yaml` (its demo `local_jwks`
//! key, issuer `tokengate-demo`, audience `tokengate`), minted here with SHA-256 from `sha2`. Shared by the
//! tests that send verified identities through the shipped filter chain (identity.rs, limits.rs).

#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use wasm_test::repo_root;

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// base64url without padding.
pub fn base64url(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// Decodes base64url without padding (panics on other characters).
pub fn base64url_decode(s: &str) -> Vec<u8> {
    let vals: Vec<u32> = s
        .bytes()
        .map(|c| ABC.iter().position(|&a| a == c).expect("base64url") as u32)
        .collect();
    let mut out = Vec::new();
    for chunk in vals.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &v)| n | v << (18 - 6 * i));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let inner = Sha256::new()
        .chain_update(k.map(|b| b ^ 0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(k.map(|b| b ^ 0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// The HS256 demo key of the shipped `jwt_authn` provider (its `local_jwks`, key `k`, base64url).
pub fn shipped_demo_key() -> Vec<u8> {
    let yaml = std::fs::read_to_string(repo_root().join("envoy/envoy.yaml")).expect("envoy.yaml");
    let line = yaml
        .lines()
        .find(|l| l.trim_start().starts_with("inline_string:") && l.contains("\"kty\":\"oct\""))
        .expect("envoy.yaml: no local_jwks inline_string with an oct key");
    let jwks = line
        .trim_start()
        .trim_start_matches("inline_string:")
        .trim();
    let jwks: Value = serde_json::from_str(jwks.trim_matches('\'')).expect("local_jwks is JSON");
    base64url_decode(jwks["keys"][0]["k"].as_str().expect("k"))
}

/// An HS256 JWT for the shipped provider (issuer `tokengate-demo`, audience `tokengate`, expiring in
/// 5 minutes unless `claims` say otherwise).
pub fn mint(key: &[u8], claims: Value) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let mut claims = claims;
    let obj = claims.as_object_mut().expect("claims object");
    obj.entry("iss").or_insert(json!("tokengate-demo"));
    obj.entry("aud").or_insert(json!("tokengate"));
    obj.entry("exp").or_insert(json!(now + 300));
    let header = json!({"alg": "HS256", "typ": "JWT", "kid": "tokengate-demo"});
    let signing = format!(
        "{}.{}",
        base64url(header.to_string().as_bytes()),
        base64url(claims.to_string().as_bytes())
    );
    let sig = base64url(&hmac_sha256(key, signing.as_bytes()));
    format!("{signing}.{sig}")
}
