//! `unmetered_paths`: what happens to a request that is not a metered LLM call.
//!
//! ```json
//! "unmetered_paths": {"writes": "refuse", "allow": ["/v1/vector_stores", "*/fine_tuning/jobs"]}
//! ```
//! Reads (`GET`, `HEAD`, `OPTIONS`, `DELETE`, without an `upgrade` header) spend no tokens and always
//! pass. Any other request on a path that is not metered (`POST /v1/batches`, `POST
//! /v1/messages/batches`, Anthropic's legacy `/v1/complete`, `/v1/images/…`, `/v1/audio/…`, an
//! Assistants run, a WebSocket upgrade to the Realtime API) could spend provider usage the filter cannot
//! charge. With `writes: "refuse"` (the default) it is refused with 403 `path_not_metered`, unless its path
//! matches a pattern of [`BUILT_IN`] or `allow`; with `"pass"` it goes on untouched, uncharged.
//!
//! A pattern is a path where `*` stands for any run of characters (`/` included); it is matched against
//! the path as the filter reads LLM paths: without query, fragment and `;` parameters, in lower case,
//! without trailing slashes.

use super::{err, ConfigError};
use serde::Deserialize;

/// Most patterns in `allow`.
pub const MAX_ALLOW: usize = 64;
/// Longest pattern, in bytes.
pub const MAX_PATTERN_LEN: usize = 256;

/// Endpoints that are always let through: they spend no tokens (token counting, moderation, file
/// uploads, OpenAI Assistants' threads and their messages, stored chat completions' and conversations'
/// updates, cancelling a background response, a batch or a fine-tuning job; Gemini's `:countTokens`,
/// Vertex AI's `:computeTokens` and Claude-on-Vertex's `count-tokens:rawPredict`, Bedrock's
/// `count-tokens`). None of them matches a path that spends (`*/threads` is not `*/threads/runs`).
pub const BUILT_IN: [&str; 18] = [
    "*/messages/count_tokens",
    "*/responses/input_tokens",
    "*/moderations",
    "*/files",
    "*/uploads",
    "*/uploads/*",
    "*/threads",
    "*/threads/*/messages",
    "*/threads/*/messages/*",
    "*/chat/completions/*",
    "*/conversations",
    "*/conversations/*",
    "*/responses/*/cancel",
    "*/batches/*/cancel",
    "*:counttokens",
    "*:computetokens",
    "*/models/count-tokens:rawpredict",
    "*/model/*/count-tokens",
];

/// `unmetered_paths` as given.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object with writes and allow")]
pub(super) struct RawUnmetered {
    writes: Option<String>,
    allow: Option<Vec<String>>,
}

/// `unmetered_paths`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Unmetered {
    /// Refuse writes on paths that are not metered and not allowed (default); else pass them.
    pub refuse_writes: bool,
    /// The operator's patterns, in lower case (the built-in ones are always allowed too).
    pub allow: Vec<String>,
}

impl Default for Unmetered {
    fn default() -> Self {
        Unmetered {
            refuse_writes: true,
            allow: Vec::new(),
        }
    }
}

impl Unmetered {
    /// Whether a write on `path` (normalized: see the module) may pass.
    pub fn allows(&self, path: &str) -> bool {
        !self.refuse_writes
            || BUILT_IN.iter().any(|p| glob(p, path))
            || self.allow.iter().any(|p| glob(p, path))
    }
}

/// Validates `unmetered_paths`.
pub(super) fn unmetered(raw: Option<RawUnmetered>) -> Result<Unmetered, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Unmetered::default());
    };
    let refuse_writes = super::top::either(
        "unmetered_paths.writes",
        raw.writes.as_deref(),
        ("refuse", true),
        ("pass", false),
    )?;
    let given = raw.allow.unwrap_or_default();
    if given.len() > MAX_ALLOW {
        return Err(err(
            "unmetered_paths.allow",
            format!(
                "must hold at most {MAX_ALLOW} patterns, got {}",
                given.len()
            ),
        ));
    }
    let mut allow = Vec::with_capacity(given.len());
    for (i, p) in given.into_iter().enumerate() {
        let field = format!("unmetered_paths.allow[{i}]");
        if p.is_empty() || p.len() > MAX_PATTERN_LEN {
            return Err(err(
                field,
                format!("must be 1 to {MAX_PATTERN_LEN} bytes long, got {}", p.len()),
            ));
        }
        if !(p.starts_with('/') || p.starts_with('*')) {
            return Err(err(
                field,
                format!("'{p}' must start with '/' or '*' (a path, '*' for any characters)"),
            ));
        }
        if let Some(c) = p.chars().find(|c| matches!(c, '?' | '#' | ';')) {
            return Err(err(
                field,
                format!("'{p}' holds {c:?}: a pattern is matched against the path without query, fragment and ';' parameters"),
            ));
        }
        if let Some(c) = p
            .chars()
            .find(|c| matches!(c, '%' | '\\') || c.is_whitespace() || c.is_control())
        {
            return Err(err(
                field,
                format!("'{p}' holds {c:?}, which no path holds once Envoy has normalized it (write the decoded path)"),
            ));
        }
        if p.contains("//") || p.split('/').any(|seg| seg == "." || seg == "..") {
            return Err(err(
                field,
                format!("'{p}' has an empty, '.' or '..' segment, which no path has once Envoy has normalized it"),
            ));
        }
        if p == "*" || p.bytes().all(|b| b == b'*' || b == b'/') {
            return Err(err(
                field,
                format!("'{p}' matches every path: use \"writes\": \"pass\" to let every request through uncharged"),
            ));
        }
        allow.push(p.to_ascii_lowercase().trim_end_matches('/').to_string());
    }
    Ok(Unmetered {
        refuse_writes,
        allow,
    })
}

/// Whether `text` matches `pattern`, where `*` matches any run of bytes (none included). Linear in
/// practice: the classic backtracking to the last `*` only.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0usize, 0usize);
    // The last `*` seen and the text position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if t.get(ti) == Some(&c) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&b| b == b'*'))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{parse_str, refusal, with, MIN};
    use super::*;

    #[test]
    fn glob_matches_stars_over_any_run() {
        assert!(glob("*/messages/count_tokens", "/v1/messages/count_tokens"));
        assert!(glob("*/threads/*/messages", "/v1/threads/t_1/messages"));
        assert!(!glob("*/threads/*/messages", "/v1/threads/t_1/runs"));
        assert!(glob("/v1/files", "/v1/files"));
        assert!(!glob("/v1/files", "/v1/files/x"));
        assert!(glob("/v1/files*", "/v1/files/x"));
        assert!(!glob("/v1/files", "/v2/v1/files"));
        assert!(glob("*a*b*", "xxaxxbxx"));
        assert!(!glob("*a*b", "xxaxxbxx"));
        assert!(glob("", ""));
        assert!(!glob("", "/"));
    }

    #[test]
    fn glob_agrees_with_a_recursive_definition() {
        fn rec(p: &[u8], t: &[u8]) -> bool {
            match p.split_first() {
                None => t.is_empty(),
                Some((b'*', rest)) => (0..=t.len()).any(|i| rec(rest, &t[i..])),
                Some((c, rest)) => t.first() == Some(c) && rec(rest, &t[1..]),
            }
        }
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut word = |n: u64| {
            let mut w = String::new();
            for _ in 0..n {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                w.push(b"ab*/"[(s % 4) as usize] as char);
            }
            w
        };
        for i in 0..20_000u64 {
            let p = word(i % 7);
            let t = word(i % 9).replace('*', "a");
            assert_eq!(glob(&p, &t), rec(p.as_bytes(), t.as_bytes()), "{p:?} {t:?}");
        }
    }

    #[test]
    fn writes_are_refused_unless_allowed() {
        let c = parse_str(MIN).unwrap();
        assert!(c.unmetered.refuse_writes);
        assert!(!c.unmetered.allows("/v1/batches"));
        assert!(c.unmetered.allows("/v1/messages/count_tokens"));
        // Token counting of the other families (the path as the filter reads it: lower case).
        for p in [
            "/v1beta/models/gemini-2.5-flash:counttokens",
            "/v1/projects/p/locations/l/publishers/google/models/g:computetokens",
            "/v1/projects/p/locations/l/publishers/anthropic/models/count-tokens:rawpredict",
            "/model/anthropic.claude-v2%3a1/count-tokens",
        ] {
            assert!(c.unmetered.allows(p), "{p}");
        }
        for p in [
            "/v1beta/models/text-embedding-004:embedcontent",
            "/v1/projects/p/locations/l/publishers/google/models/imagen:predict",
            "/async-invoke",
        ] {
            assert!(!c.unmetered.allows(p), "{p}");
        }
        let c = parse_str(&with(
            "",
            r#","unmetered_paths": {"allow": ["/V1/Files/", "*/fine_tuning/*"]}"#,
        ))
        .unwrap();
        assert!(c.unmetered.allows("/v1/files"));
        assert!(c.unmetered.allows("/openai/v1/fine_tuning/jobs"));
        assert!(!c.unmetered.allows("/v1/batches"));
        let c = parse_str(&with("", r#","unmetered_paths": {"writes": "pass"}"#)).unwrap();
        assert!(c.unmetered.allows("/v1/batches"));
    }

    #[test]
    fn bad_patterns_are_refused_with_one_line() {
        for (cfg, want) in [
            (
                r#"{"writes": "open"}"#,
                "unmetered_paths.writes: must be \"refuse\" or \"pass\", got \"open\"",
            ),
            (
                r#"{"allow": ["v1/files"]}"#,
                "unmetered_paths.allow[0]: 'v1/files' must start with '/' or '*'",
            ),
            (
                r#"{"allow": ["/v1/files?x=1"]}"#,
                "unmetered_paths.allow[0]: '/v1/files?x=1' holds '?'",
            ),
            (
                r#"{"allow": ["/ok", "*"]}"#,
                "unmetered_paths.allow[1]: '*' matches every path",
            ),
            (
                r#"{"allow": ["/*"]}"#,
                "unmetered_paths.allow[0]: '/*' matches every path",
            ),
            (
                r#"{"allow": [""]}"#,
                "unmetered_paths.allow[0]: must be 1 to 256 bytes long, got 0",
            ),
            (
                r#"{"allow": ["/v1/a b"]}"#,
                "'/v1/a b' holds ' ', which no path holds",
            ),
            (
                r#"{"allow": ["/v1/%2A"]}"#,
                "'/v1/%2A' holds '%', which no path holds",
            ),
            (
                r#"{"allow": ["/v1//uploads"]}"#,
                "'/v1//uploads' has an empty, '.' or '..' segment",
            ),
            (
                r#"{"allow": ["/v1/../batches"]}"#,
                "'/v1/../batches' has an empty, '.' or '..' segment",
            ),
            (
                r#"{"writes": "refuse", "deny": []}"#,
                "unknown field `deny`",
            ),
        ] {
            let msg = refusal(&with("", &format!(r#","unmetered_paths": {cfg}"#)));
            assert!(msg.contains(want), "{cfg}: {msg}");
        }
    }
}
