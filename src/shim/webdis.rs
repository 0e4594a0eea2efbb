//! The Webdis shim protocol shared by monthly quotas ([`crate::quota`]) and global buckets
//! ([`crate::global`]): how a Lua script call is encoded for Webdis, and how its answer is read. Pure.
//!
//! # Request
//! `POST /` ([`WEBDIS_PATH`]) with the command path as the body (no content-type needed), every segment
//! percent-encoded with only `[A-Za-z0-9_-]` left as is ([`webdis_encode`]), so `/`, `+`, `%`, space and
//! `.` never reach Webdis raw (a last segment ending in `.json`/`.raw` would otherwise be taken as a
//! format suffix; the last argument is also always the protocol tag [`PROTOCOL_TAG`]):
//! ```text
//! EVALSHA/<sha1>/6/tg%3Aq%3A%7Bacme%7D%3A2026-11/…/120/1024/1000000/0/1798761600/0/req-1/0/0/1/<fp>/3/tg1
//! ```
//! The host sends [`ScriptCall::EvalSha`] (a few hundred bytes) and, when the reply parses as
//! [`ShimError::NoScript`] (Redis restarted or `SCRIPT FLUSH`), resends the same arguments with
//! [`ScriptCall::Eval`] (the whole script, which also loads it into Redis' cache for the next calls).
//! Callout headers: `:method POST`, `:path /`, `:authority <shim>`. Do not send `connection: close`:
//! Webdis 0.1.9 then never answers a request whose body arrives in a later read than its headers
//! (keep-alive requests, which Envoy sends, are fine).
//!
//! # Replies
//! Webdis answers HTTP 200 with `{"EVAL": <value>}` / `{"EVALSHA": <value>}`; the scripts return flat
//! arrays of integers (Webdis turns nested tables into `null`). Redis errors come as
//! `[false, "ERR …"]` (`NOSCRIPT …` for an unknown SHA-1), Redis down as 503 with an empty body, an
//! ACL-denied command as 403. [`parse_int_array`] classifies all of it as a [`ShimError`] so the host
//! can apply its failure mode and feed the shim's circuit breaker.
//!
//! ```
//! # use tokengate::shim::webdis::*;
//! let body = command_body(ScriptCall::EvalSha, "return 1", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
//!                         &["tg:q:{a}"], &["1.5".to_string()]);
//! assert_eq!(body, "EVALSHA/e0e1f9fabfc9d4800c877a703b823ac0578ff8db/1/tg%3Aq%3A%7Ba%7D/1%2E5");
//! assert_eq!(parse_int_array(200, br#"{"EVALSHA":[1,2]}"#, 2), Ok(vec![1, 2]));
//! assert_eq!(parse_int_array(503, b"", 2), Err(ShimError::Unavailable));
//! ```

/// Protocol tag passed as the last argument of every script; a script receiving anything else refuses to
/// run (host and script out of sync). It also guarantees the last path segment never ends in `.json`.
/// The tag sits at a fixed position per script (and the batch script checks its key/argument counts),
/// so a call laid out for another version of a script is refused too, not misread.
pub const PROTOCOL_TAG: &str = "tg1";

/// How the host names the script to Webdis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptCall {
    /// `EVAL/<script>/…`: always works, the whole script in the body (sizes: `docs/benchmarks.md`); also
    /// (re)loads the script into Redis' cache.
    Eval,
    /// `EVALSHA/<sha1>/…`: only the arguments, a few hundred bytes; fails with [`ShimError::NoScript`]
    /// when Redis lost its cache.
    EvalSha,
}

/// The Webdis path the host posts to; the command goes in the body.
pub const WEBDIS_PATH: &str = "/";

/// Largest integer sent to or expected from Lua (its numbers are doubles: exact up to 2^53).
pub const MAX_LUA_INT: u64 = (1 << 53) - 1;

/// Percent-encodes one path segment for Webdis: only `[A-Za-z0-9_-]` stay raw.
pub fn webdis_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len() * 3);
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            push_percent(&mut out, b);
        }
    }
    out
}

/// Appends `%XX` (upper-case hex) for byte `b`: Webdis segments here, key parts in [`crate::store::keys`].
pub(crate) fn push_percent(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let digit = |n: u8| char::from(HEX.get(usize::from(n & 0x0f)).copied().unwrap_or(b'0'));
    out.push('%');
    out.push(digit(b >> 4));
    out.push(digit(b));
}

/// The Webdis command path (sent as the body of `POST /`) that runs `script` with `keys` and `args`:
/// `EVAL/<script>/<numkeys>/<keys…>/<args…>` or `EVALSHA/<sha>/…`, every segment through
/// [`webdis_encode`].
pub fn command_body(
    call: ScriptCall,
    script: &str,
    sha: &str,
    keys: &[&str],
    args: &[String],
) -> String {
    let mut body = String::with_capacity(script.len() * 2 + 256);
    match call {
        ScriptCall::Eval => {
            body.push_str("EVAL/");
            body.push_str(&webdis_encode(script));
        }
        ScriptCall::EvalSha => {
            body.push_str("EVALSHA/");
            body.push_str(sha);
        }
    }
    body.push('/');
    body.push_str(&keys.len().to_string());
    for k in keys {
        body.push('/');
        body.push_str(&webdis_encode(k));
    }
    for a in args {
        body.push('/');
        body.push_str(&webdis_encode(a));
    }
    body
}

/// An integer argument for Lua, capped at [`MAX_LUA_INT`] (beyond it Lua would round).
pub fn lua_int(v: u64) -> String {
    v.min(MAX_LUA_INT).to_string()
}

/// Why a shim callout (quota or global bucket) gave no usable answer. The host maps each to its failure
/// mode and breaker event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimError {
    /// Redis or Webdis down, or the callout timed out: status 0/5xx, or an empty body.
    Unavailable,
    /// Webdis refused the command (ACL): status 403.
    Forbidden,
    /// `EVALSHA` of a script Redis does not know: resend with [`ScriptCall::Eval`].
    NoScript,
    /// Redis (or the script) answered an error, e.g. `ERR tokengate: not a count at …`.
    RedisError(String),
    /// Anything else malformed: other statuses, not JSON, wrong shape, types, length or ranges.
    Garbage(String),
}

impl ShimError {
    /// True when Redis may have run the script although the caller got this error: the callout timed
    /// out or came back malformed, or an error that something between Webdis and Redis made up (Envoy's
    /// `redis_proxy` answers `upstream failure` when its `op_timeout` passes while the command still sits
    /// in Redis' socket, and Redis then runs it). False only for errors that prove the script did not
    /// run: NOSCRIPT, the script's own argument checks (`ERR tokengate: …`, before any write), and Redis'
    /// refusals before execution (BUSY, LOADING, a cluster redirection, a read-only replica, OOM, ACL).
    /// One `ERR tokengate:` answer proves the opposite: [`ALREADY_RESERVED`], the reservation script's
    /// refusal of a request id it already holds, means the same command reached Redis twice (a shim that
    /// sent it again after Redis stalled) and the first one reserved.
    pub fn may_have_run(&self) -> bool {
        const NOT_RUN: &[&str] = &[
            "ERR tokengate:",
            "NOSCRIPT",
            "BUSY",
            "LOADING",
            "MOVED",
            "ASK",
            "CROSSSLOT",
            "CLUSTERDOWN",
            "TRYAGAIN",
            "MASTERDOWN",
            "READONLY",
            "OOM",
            "NOPERM",
            "NOAUTH",
        ];
        match self {
            ShimError::Unavailable | ShimError::Garbage(_) => true,
            ShimError::Forbidden | ShimError::NoScript => false,
            ShimError::RedisError(e) => {
                e.starts_with(ALREADY_RESERVED) || !NOT_RUN.iter().any(|p| e.starts_with(p))
            }
        }
    }
}

/// The reservation script's answer to a request id it already reserved or reconciled (`reserve.lua`).
pub const ALREADY_RESERVED: &str = "ERR tokengate: request already reserved or reconciled";

impl std::fmt::Display for ShimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShimError::Unavailable => write!(f, "quota store unavailable"),
            ShimError::Forbidden => write!(f, "quota store refused the command (403)"),
            ShimError::NoScript => write!(f, "quota script not loaded (NOSCRIPT)"),
            ShimError::RedisError(e) => write!(f, "quota store error: {e}"),
            ShimError::Garbage(e) => write!(f, "malformed quota reply: {e}"),
        }
    }
}

/// Checks the status and envelope and returns the array of `len` integers the script answered (each
/// within ±[`MAX_LUA_INT`]); every failure is classified as a [`ShimError`]. Never panics.
pub fn parse_int_array(http_status: u32, body: &[u8], len: usize) -> Result<Vec<i64>, ShimError> {
    parse_int_array_of(http_status, body, len..=len)
}

/// [`parse_int_array`] with a length in `lens` (a reply that grew a trailing element).
pub fn parse_int_array_of(
    http_status: u32,
    body: &[u8],
    lens: std::ops::RangeInclusive<usize>,
) -> Result<Vec<i64>, ShimError> {
    match http_status {
        200 => {}
        0 | 500..=599 => return Err(ShimError::Unavailable),
        403 => return Err(ShimError::Forbidden),
        s => return Err(ShimError::Garbage(format!("http status {s}"))),
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ShimError::Unavailable);
    }
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| ShimError::Garbage(format!("not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| ShimError::Garbage("not a JSON object".into()))?;
    let value = match (obj.len(), obj.get("EVAL").or_else(|| obj.get("EVALSHA"))) {
        (1, Some(value)) => value,
        _ => return Err(ShimError::Garbage("expected {\"EVAL\": …}".into())),
    };
    let arr = value
        .as_array()
        .ok_or_else(|| ShimError::Garbage(format!("not an array: {value}")))?;
    // Redis errors: [false, "ERR …"].
    if let (Some(serde_json::Value::Bool(false)), Some(msg)) = (arr.first(), arr.get(1)) {
        let msg = msg.as_str().unwrap_or_default().to_string();
        if msg.starts_with("NOSCRIPT") {
            return Err(ShimError::NoScript);
        }
        return Err(ShimError::RedisError(msg));
    }
    if !lens.contains(&arr.len()) {
        return Err(ShimError::Garbage(format!(
            "expected {lens:?} integers, got {}",
            arr.len()
        )));
    }
    arr.iter()
        .map(|x| {
            x.as_i64()
                .filter(|n| n.unsigned_abs() <= MAX_LUA_INT)
                .ok_or_else(|| ShimError::Garbage(format!("not an integer: {x}")))
        })
        .collect()
}

/// SHA-1 in hex, as Redis' `SCRIPT LOAD` names a script: tests check the `*_SHA1` constants against the
/// script text with it (a real Redis checks them again in `tests/redis_live.rs`). Test-only: the filter
/// never hashes a script at run time.
/// Why a shim call failed, with a line for the log that names the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The class of failure.
    pub error: ShimError,
    /// What to log.
    pub why: String,
}

#[cfg(test)]
pub(crate) fn sha1_hex(data: &[u8]) -> String {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_bodies_put_the_key_count_then_keys_then_arguments() {
        let keys = ["k/1", "k 2"];
        let args = ["a+b".to_string(), "x.json".to_string()];
        assert_eq!(
            command_body(ScriptCall::EvalSha, "return 1", "abc", &keys, &args),
            "EVALSHA/abc/2/k%2F1/k%202/a%2Bb/x%2Ejson"
        );
        assert_eq!(
            command_body(ScriptCall::Eval, "return {1}", "abc", &[], &[]),
            "EVAL/return%20%7B1%7D/0"
        );
        assert_eq!(webdis_encode("aZ09_-é"), "aZ09_-%C3%A9");
        assert_eq!(lua_int(u64::MAX), MAX_LUA_INT.to_string());
    }

    #[test]
    fn only_errors_that_prove_the_script_did_not_run_are_certain() {
        for e in [
            "ERR upstream failure",
            "ERR no upstream host",
            "ERR something new",
        ] {
            assert!(ShimError::RedisError(e.into()).may_have_run(), "{e}");
        }
        for e in [
            "ERR tokengate: bad argument",
            "BUSY Redis is busy running a script",
            "MOVED 3999 127.0.0.1:6381",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "READONLY You can't write against a read only replica.",
        ] {
            assert!(!ShimError::RedisError(e.into()).may_have_run(), "{e}");
        }
        assert!(ShimError::Unavailable.may_have_run());
        assert!(!ShimError::NoScript.may_have_run());
    }

    #[test]
    fn the_reply_envelope_and_its_failures_are_classified() {
        assert_eq!(
            parse_int_array(200, br#"{"EVAL":[-3,0]}"#, 2),
            Ok(vec![-3, 0])
        );
        assert_eq!(parse_int_array(0, b"", 1), Err(ShimError::Unavailable));
        assert_eq!(parse_int_array(200, b" ", 1), Err(ShimError::Unavailable));
        assert_eq!(parse_int_array(403, b"{}", 1), Err(ShimError::Forbidden));
        assert_eq!(
            parse_int_array(200, br#"{"EVALSHA":[false,"NOSCRIPT x"]}"#, 1),
            Err(ShimError::NoScript)
        );
        assert_eq!(
            parse_int_array(200, br#"{"EVAL":[false,"ERR x"]}"#, 1),
            Err(ShimError::RedisError("ERR x".into()))
        );
        for garbage in [
            &br#"{"EVAL":[1,2]}"#[..],
            br#"{"EVAL":[9007199254740992]}"#,
            br#"{"GET":[1]}"#,
            b"[1]",
        ] {
            assert!(
                matches!(parse_int_array(200, garbage, 1), Err(ShimError::Garbage(_))),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn the_test_sha1_matches_the_reference_vectors() {
        assert_eq!(sha1_hex(b""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(sha1_hex(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(
            sha1_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        assert_eq!(
            sha1_hex(&[b'a'; 1000]),
            "291e9a6c66994949b57ba5e650361e98fc36b1ba"
        );
    }
}
