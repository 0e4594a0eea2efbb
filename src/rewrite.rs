//! Request body rewrites: set the model, inject `stream_options.include_usage`, clamp the output limit.
//! Pure: bytes in, bytes out (or `None` when nothing changes, so the host leaves the body alone).
//!
//! # Why
//! * Routing to a fallback model changes `model`.
//! * OpenAI streams report usage only with `stream_options.include_usage = true`; the filter injects it
//!   to settle quotas exactly, and [`crate::usage::SseScanner`] strips the extra chunk again.
//! * A quota reservation admitted with less output than asked ([`crate::quota::Reason::Clamped`]) must
//!   lower the request's output limit to what was reserved.
//!
//! # Encoding note
//! The body is parsed into a `serde_json::Value` and written back compactly. Without serde_json's
//! `preserve_order` feature, objects come back with their keys sorted; whitespace is not kept. JSON
//! objects are unordered, so providers see the same request. Unchanged bodies are never re-serialized.
//!
//! # Example
//! ```
//! # use tokengate::rewrite::*;
//! let edits = Edits { inject_include_usage: true, clamp_max_output: Some(100), ..Edits::default() };
//! let out = rewrite(br#"{"model":"m","stream":true,"max_tokens":4096}"#, &edits).unwrap().unwrap();
//! assert_eq!(out, br#"{"max_tokens":100,"model":"m","stream":true,"stream_options":{"include_usage":true}}"#);
//! ```

use serde_json::{Map, Value};

/// Every field name an API uses for the output limit (chat: `max_tokens` or `max_completion_tokens`,
/// legacy completions: `max_tokens`, responses: `max_output_tokens`, Anthropic: `max_tokens`).
pub const MAX_OUTPUT_FIELDS: [&str; 3] =
    ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// The changes to apply. [`Edits::default`] changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edits {
    /// Replace `model` with this name.
    pub set_model: Option<String>,
    /// Set `stream_options.include_usage = true` when `stream` is `true` and it is not already true
    /// (other `stream_options` fields are kept). Only OpenAI chat/completions understand it.
    pub inject_include_usage: bool,
    /// Lower every present output-limit field ([`MAX_OUTPUT_FIELDS`]) above this value to it; when none
    /// is present (or all are `null`), set `max_output_field` to it.
    pub clamp_max_output: Option<u64>,
    /// Field to add when the body has no output limit: `max_tokens` (chat, completions, Anthropic) or
    /// `max_output_tokens` (responses).
    pub max_output_field: String,
}

impl Default for Edits {
    fn default() -> Self {
        Self {
            set_model: None,
            inject_include_usage: false,
            clamp_max_output: None,
            max_output_field: "max_tokens".to_string(),
        }
    }
}

/// What [`rewrite_with_report`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rewritten {
    /// The new body, or `None` when nothing changed.
    pub body: Option<Vec<u8>>,
    /// `model` was replaced.
    pub model_changed: bool,
    /// `include_usage` was injected: the host must strip the usage-only chunk from the stream.
    pub injected_include_usage: bool,
    /// An output limit was lowered or added.
    pub output_clamped: bool,
}

/// Applies `edits` to a JSON request body. `Ok(None)`: nothing to change. `Err`: the body is not a JSON
/// object (the message says why).
pub fn rewrite(body: &[u8], edits: &Edits) -> Result<Option<Vec<u8>>, String> {
    rewrite_with_report(body, edits).map(|r| r.body)
}

/// Same as [`rewrite`], also telling which edits took effect.
pub fn rewrite_with_report(body: &[u8], edits: &Edits) -> Result<Rewritten, String> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| "body is not a JSON object".to_string())?;
    let mut report = Rewritten {
        model_changed: set_model(obj, edits.set_model.as_deref()),
        injected_include_usage: edits.inject_include_usage && inject_include_usage(obj),
        output_clamped: edits
            .clamp_max_output
            .is_some_and(|max| clamp(obj, max, &edits.max_output_field)),
        body: None,
    };
    if report.model_changed || report.injected_include_usage || report.output_clamped {
        report.body = Some(serde_json::to_vec(&v).map_err(|e| format!("cannot encode body: {e}"))?);
    }
    Ok(report)
}

fn set_model(obj: &mut Map<String, Value>, model: Option<&str>) -> bool {
    let Some(model) = model else { return false };
    if obj.get("model").and_then(Value::as_str) == Some(model) {
        return false;
    }
    obj.insert("model".to_string(), Value::String(model.to_string()));
    true
}

fn inject_include_usage(obj: &mut Map<String, Value>) -> bool {
    if obj.get("stream") != Some(&Value::Bool(true)) {
        return false;
    }
    match obj.get_mut("stream_options") {
        None | Some(Value::Null) => {
            let mut so = Map::new();
            so.insert("include_usage".to_string(), Value::Bool(true));
            obj.insert("stream_options".to_string(), Value::Object(so));
            true
        }
        Some(Value::Object(so)) => {
            if so.get("include_usage") == Some(&Value::Bool(true)) {
                return false;
            }
            so.insert("include_usage".to_string(), Value::Bool(true));
            true
        }
        // Not an object: the provider will reject the request anyway; leave it as the client sent it.
        Some(_) => false,
    }
}

fn clamp(obj: &mut Map<String, Value>, max: u64, field_if_absent: &str) -> bool {
    let mut present = false;
    let mut changed = false;
    for f in MAX_OUTPUT_FIELDS {
        let Some(v) = obj.get_mut(f) else { continue };
        if v.is_null() {
            continue;
        }
        present = true;
        // A non-integer or larger value is replaced: the reservation only covers `max`.
        let fits = v.as_u64().is_some_and(|n| n <= max);
        if !fits {
            *v = Value::from(max);
            changed = true;
        }
    }
    if !present {
        obj.insert(field_if_absent.to_string(), Value::from(max));
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn no_edits_return_none_without_reserializing() {
        let body = br#"{ "model" : "gpt-4.1", "messages": [] }"#;
        assert_eq!(rewrite(body, &Edits::default()), Ok(None));
    }

    #[test]
    fn setting_the_same_model_is_no_change() {
        let e = Edits {
            set_model: Some("gpt-4.1".into()),
            ..Edits::default()
        };
        assert_eq!(rewrite(br#"{"model":"gpt-4.1"}"#, &e), Ok(None));
    }

    #[test]
    fn setting_another_model_keeps_every_other_field() {
        let e = Edits {
            set_model: Some("gpt-4.1-mini".into()),
            ..Edits::default()
        };
        let out = rewrite(br#"{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"x":{"y":[1,2.5,null]}}"#, &e)
            .unwrap()
            .unwrap();
        assert_eq!(
            json(&out),
            json(br#"{"model":"gpt-4.1-mini","messages":[{"role":"user","content":"hi"}],"x":{"y":[1,2.5,null]}}"#)
        );
    }

    #[test]
    fn include_usage_is_injected_only_for_streams() {
        let e = Edits {
            inject_include_usage: true,
            ..Edits::default()
        };
        assert_eq!(rewrite(br#"{"model":"m"}"#, &e), Ok(None));
        assert_eq!(rewrite(br#"{"stream":false}"#, &e), Ok(None));
        assert_eq!(rewrite(br#"{"stream":"true"}"#, &e), Ok(None));
        let r = rewrite_with_report(br#"{"stream":true}"#, &e).unwrap();
        assert!(r.injected_include_usage);
        assert_eq!(
            json(&r.body.unwrap()),
            json(br#"{"stream":true,"stream_options":{"include_usage":true}}"#)
        );
    }

    #[test]
    fn include_usage_keeps_other_stream_options_and_is_not_reported_when_already_true() {
        let e = Edits {
            inject_include_usage: true,
            ..Edits::default()
        };
        let r = rewrite_with_report(br#"{"stream":true,"stream_options":{"include_obfuscation":false,"include_usage":false}}"#, &e)
            .unwrap();
        assert!(r.injected_include_usage);
        assert_eq!(
            json(&r.body.unwrap()),
            json(br#"{"stream":true,"stream_options":{"include_obfuscation":false,"include_usage":true}}"#)
        );
        let r = rewrite_with_report(
            br#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            &e,
        )
        .unwrap();
        assert_eq!(r, Rewritten::default());
        assert!(
            rewrite_with_report(br#"{"stream":true,"stream_options":null}"#, &e)
                .unwrap()
                .injected_include_usage
        );
        assert_eq!(
            rewrite(br#"{"stream":true,"stream_options":"x"}"#, &e),
            Ok(None)
        );
    }

    #[test]
    fn clamping_lowers_every_present_output_limit_above_the_grant() {
        let e = Edits {
            clamp_max_output: Some(500),
            ..Edits::default()
        };
        let out = rewrite(br#"{"max_tokens":4096,"max_completion_tokens":300}"#, &e)
            .unwrap()
            .unwrap();
        assert_eq!(
            json(&out),
            json(br#"{"max_tokens":500,"max_completion_tokens":300}"#)
        );
        assert_eq!(rewrite(br#"{"max_output_tokens":500}"#, &e), Ok(None));
        let out = rewrite(br#"{"max_output_tokens":1e9}"#, &e)
            .unwrap()
            .unwrap();
        assert_eq!(json(&out), json(br#"{"max_output_tokens":500}"#));
    }

    #[test]
    fn clamping_adds_the_given_field_when_no_limit_is_present() {
        let e = Edits {
            clamp_max_output: Some(64),
            max_output_field: "max_output_tokens".into(),
            ..Edits::default()
        };
        let out = rewrite(br#"{"input":"hi","max_tokens":null}"#, &e)
            .unwrap()
            .unwrap();
        assert_eq!(
            json(&out),
            json(br#"{"input":"hi","max_tokens":null,"max_output_tokens":64}"#)
        );
    }

    #[test]
    fn all_edits_combine_into_one_serialization() {
        let e = Edits {
            set_model: Some("b".into()),
            inject_include_usage: true,
            clamp_max_output: Some(10),
            max_output_field: "max_tokens".into(),
        };
        let r = rewrite_with_report(br#"{"model":"a","stream":true}"#, &e).unwrap();
        assert!(r.model_changed && r.injected_include_usage && r.output_clamped);
        assert_eq!(
            r.body.unwrap(),
            br#"{"max_tokens":10,"model":"b","stream":true,"stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn non_object_bodies_are_errors_not_panics() {
        let e = Edits {
            set_model: Some("x".into()),
            ..Edits::default()
        };
        for b in [&b"not json"[..], b"[1]", b"", b"\"s\"", b"{\"a\":"] {
            assert!(rewrite(b, &e).is_err(), "{}", String::from_utf8_lossy(b));
        }
    }

    #[test]
    fn unicode_and_escapes_survive_a_rewrite() {
        let e = Edits {
            set_model: Some("m2".into()),
            ..Edits::default()
        };
        let body = "{\"model\":\"m\",\"messages\":[{\"content\":\"h\u{e9}llo \\\"q\\\" \\u2028 \u{1F600}\"}]}";
        let out = rewrite(body.as_bytes(), &e).unwrap().unwrap();
        assert_eq!(json(&out)["messages"], json(body.as_bytes())["messages"]);
    }
}
