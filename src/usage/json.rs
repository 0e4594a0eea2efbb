//! A provider's `usage` in a whole JSON answer (chat, completions, embeddings, Responses, Anthropic
//! messages), normalized to OpenAI's meaning ([`super::Usage`]).

use super::{Source, Usage};
use serde_json::{Map, Value};

pub(super) fn uint(obj: &Map<String, Value>, key: &str) -> Option<u64> {
    obj.get(key).and_then(Value::as_u64)
}

fn nested_uint(obj: &Map<String, Value>, outer: &str, key: &str) -> Option<u64> {
    obj.get(outer)
        .and_then(Value::as_object)
        .and_then(|o| uint(o, key))
}

/// Reads a provider `usage` object (any of the supported formats). `None` when it has no token counts.
pub fn from_usage_object(u: &Map<String, Value>) -> Option<Usage> {
    if u.contains_key("prompt_tokens") || u.contains_key("completion_tokens") {
        let prompt = match u.get("prompt_tokens") {
            Some(v) => v.as_u64()?,
            None => 0,
        };
        let completion = match u.get("completion_tokens") {
            Some(v) => v.as_u64()?,
            None => 0,
        };
        return Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: nested_uint(u, "prompt_tokens_details", "cached_tokens")
                .unwrap_or(0)
                .min(prompt),
            reasoning_tokens: nested_uint(u, "completion_tokens_details", "reasoning_tokens")
                .unwrap_or(0)
                .min(completion),
            source: Source::Provider,
        });
    }
    if u.contains_key("input_tokens") || u.contains_key("output_tokens") {
        let input = match u.get("input_tokens") {
            Some(v) => v.as_u64()?,
            None => 0,
        };
        let output = match u.get("output_tokens") {
            Some(v) => v.as_u64()?,
            None => 0,
        };
        let cache_read = uint(u, "cache_read_input_tokens").unwrap_or(0);
        let cache_write = uint(u, "cache_creation_input_tokens").unwrap_or(0);
        let prompt = input.saturating_add(cache_read).saturating_add(cache_write);
        let cached = nested_uint(u, "input_tokens_details", "cached_tokens")
            .unwrap_or(0)
            .saturating_add(cache_read);
        return Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: output,
            cached_tokens: cached.min(prompt),
            reasoning_tokens: nested_uint(u, "output_tokens_details", "reasoning_tokens")
                .unwrap_or(0)
                .min(output),
            source: Source::Provider,
        });
    }
    None
}

/// [`from_usage_object`] of a response that generates output: `None` also when the object lacks the
/// input or the output count of its format (`prompt_tokens` and `completion_tokens`, or
/// `input_tokens` and `output_tokens`): such a usage would settle the missing side at 0 (a provider
/// that reported the prompt only, or `{}` on an Anthropic `message_delta`).
pub fn complete_usage(u: &Map<String, Value>) -> Option<Usage> {
    let has = |k: &str| u.get(k).is_some_and(Value::is_u64);
    let complete = if u.contains_key("prompt_tokens") || u.contains_key("completion_tokens") {
        has("prompt_tokens") && has("completion_tokens")
    } else {
        has("input_tokens") && has("output_tokens")
    };
    complete.then(|| from_usage_object(u)).flatten()
}

/// Usage from a parsed response: top-level `usage`, or `response.usage` (a responses-API event), read
/// by `read`.
pub(super) fn from_value_with(
    v: &Value,
    read: fn(&Map<String, Value>) -> Option<Usage>,
) -> Option<Usage> {
    let obj = v.as_object()?;
    if let Some(u) = obj.get("usage").and_then(Value::as_object) {
        return read(u);
    }
    obj.get("response")
        .and_then(Value::as_object)?
        .get("usage")
        .and_then(Value::as_object)
        .and_then(read)
}

/// Usage from a whole (non-streamed) JSON response body of any supported API. `None` when the body is
/// not JSON or reports no usage.
///
/// Only `usage` and `response` are built as values; everything else (the choices, the generated text)
/// is checked as JSON and skipped without building a tree: the same answer as parsing the whole body
/// into a [`Value`] and reading it with [`from_value`] (a repeated key: the last one counts), at a
/// fraction of the cost, on every response that settles a quota.
pub fn from_json(body: &[u8]) -> Option<Usage> {
    json_usage(body, from_usage_object)
}

/// [`from_json`] of a response that generates output (every API but embeddings): `None` also when
/// the usage lacks its input or output count ([`complete_usage`]).
pub fn from_json_with_output(body: &[u8]) -> Option<Usage> {
    json_usage(body, complete_usage)
}

fn json_usage(body: &[u8], read: fn(&Map<String, Value>) -> Option<Usage>) -> Option<Usage> {
    let top: UsageFields = serde_json::from_slice(body).ok()?;
    if let Some(u) = top.usage.as_ref().and_then(Value::as_object) {
        return read(u);
    }
    top.response
        .as_ref()
        .and_then(Value::as_object)?
        .get("usage")
        .and_then(Value::as_object)
        .and_then(read)
}

/// The two top-level members of a response body that can carry usage ([`from_json`]).
struct UsageFields {
    usage: Option<Value>,
    response: Option<Value>,
}

impl<'de> serde::Deserialize<'de> for UsageFields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(UsageFieldsVisitor)
    }
}

/// A top-level member name of a response body: `usage`, `response` or another (skipped).
enum Member {
    Usage,
    Response,
    Other,
}

impl<'de> serde::Deserialize<'de> for Member {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_identifier(MemberVisitor)
    }
}

struct MemberVisitor;

impl serde::de::Visitor<'_> for MemberVisitor {
    type Value = Member;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Member, E> {
        Ok(match v {
            "usage" => Member::Usage,
            "response" => Member::Response,
            _ => Member::Other,
        })
    }
}

struct UsageFieldsVisitor;

impl<'de> serde::de::Visitor<'de> for UsageFieldsVisitor {
    type Value = UsageFields;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UsageFields, A::Error> {
        let mut out = UsageFields {
            usage: None,
            response: None,
        };
        while let Some(member) = map.next_key::<Member>()? {
            match member {
                Member::Usage => out.usage = Some(map.next_value()?),
                Member::Response => out.response = Some(map.next_value()?),
                Member::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(p: u64, c: u64, cached: u64, r: u64) -> Usage {
        Usage {
            prompt_tokens: p,
            completion_tokens: c,
            cached_tokens: cached,
            reasoning_tokens: r,
            source: Source::Provider,
        }
    }

    #[test]
    fn chat_completion_body_yields_prompt_completion_cached_and_reasoning() {
        let body = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":40,"total_tokens":140,
            "prompt_tokens_details":{"cached_tokens":64},"completion_tokens_details":{"reasoning_tokens":10}}}"#;
        assert_eq!(from_json(body), Some(u(100, 40, 64, 10)));
    }

    #[test]
    fn embeddings_body_has_prompt_tokens_only() {
        assert_eq!(
            from_json(br#"{"data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}"#),
            Some(u(8, 0, 0, 0))
        );
    }

    #[test]
    fn responses_api_body_uses_input_and_output_tokens() {
        let body = br#"{"object":"response","usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":20},
            "output_tokens":30,"output_tokens_details":{"reasoning_tokens":12},"total_tokens":80}}"#;
        assert_eq!(from_json(body), Some(u(50, 30, 20, 12)));
    }

    #[test]
    fn anthropic_body_adds_cache_reads_and_writes_to_the_prompt() {
        let body =
            br#"{"type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":100,
            "cache_read_input_tokens":1000,"output_tokens":7}}"#;
        assert_eq!(from_json(body), Some(u(1110, 7, 1000, 0)));
    }

    #[test]
    fn bodies_without_usable_usage_give_none() {
        for b in [
            &b"not json"[..],
            b"[]",
            b"{}",
            br#"{"usage":null}"#,
            br#"{"usage":{}}"#,
            br#"{"usage":{"prompt_tokens":"9"}}"#,
            br#"{"usage":{"input_tokens":-1}}"#,
        ] {
            assert_eq!(from_json(b), None, "{}", String::from_utf8_lossy(b));
        }
    }

    #[test]
    fn from_json_reads_what_a_parse_of_the_whole_body_reads() {
        let whole = |b: &[u8]| {
            serde_json::from_slice::<Value>(b)
                .ok()
                .and_then(|v| from_value_with(&v, from_usage_object))
        };
        let bodies: &[&[u8]] = &[
            br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello \"there\" \u00e9!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":24,"completion_tokens":4,"total_tokens":28}}"#,
            // The last of a repeated member counts, as in a parsed object.
            br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":2},"usage":null}"#,
            // `usage` first, `response.usage` only when there is no `usage` object.
            br#"{"usage":7,"response":{"usage":{"input_tokens":5,"output_tokens":6}}}"#,
            br#"{"response":{"usage":{"input_tokens":5,"output_tokens":6}},"usage":{"input_tokens":1}}"#,
            br#"{"usage":{"no_tokens":1},"response":{"usage":{"input_tokens":5}}}"#,
            br#"{"response":"text","usage":{"prompt_tokens":3}}"#,
            br#"{"response":[1,{"usage":{}}],"x":{"usage":{"prompt_tokens":3}}}"#,
            br#"{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":9,"output_tokens":1,"output_tokens_details":{"reasoning_tokens":1}}}}"#,
            br#"{"nested":{"usage":{"prompt_tokens":3}},"list":[[],{},null,true,-1.5e3,"a\nb"]}"#,
            br#"  {"usage":{"prompt_tokens":18446744073709551615}}  "#,
            br#"{"usage":{"prompt_tokens":1}} trailing"#,
            br#"{"usage":{"prompt_tokens":1},}"#,
            br#"{"choices":[{"text":"unterminated}],"usage":{"prompt_tokens":1}}"#,
            br#"{"usage":{"prompt_tokens":1}"#,
            b"",
            b"null",
            b"[]",
            br#""usage""#,
            br#"{"usage":{"prompt_tokens":null,"completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":-0,"completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":5.0,"completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":1e2,"completion_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":18446744073709551616}}"#,
            br#"{"usage":{"prompt_tokens":[1],"completion_tokens":{"a":1}}}"#,
            br#"{"usage":{"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":9}}}"#,
            br#"{"usage":{"prompt_tokens":30,"prompt_tokens_details":{"cached_tokens":9},"prompt_tokens_details":[]}}"#,
            br#"{"usage":{"prompt_tokens":30,"prompt_tokens_details":{"cached_tokens":9,"cached_tokens":"x"}}}"#,
            br#"{"usage":{"prompt_tokens":30,"prompt_tokens_details":{"cached_tokens":90},"completion_tokens_details":{"reasoning_tokens":2}}}"#,
            br#"{"usage":{"input_tokens":4,"output_tokens":-2}}"#,
            br#"{"usage":{"input_tokens":4,"cache_read_input_tokens":"7","cache_creation_input_tokens":2.5}}"#,
            br#"{"usage":{"input_tokens":4,"cache_read_input_tokens":7,"input_tokens_details":{"cached_tokens":1},"output_tokens_details":{"reasoning_tokens":9},"output_tokens":3}}"#,
            br#"{"usage":{"prompt_tokens":1,"input_tokens":"x"}}"#,
            br#"{"usage":{"output_tokens":1,"completion_tokens_details":{"reasoning_tokens":1}}}"#,
            br#"{"usage":{"prompt_tokens":1,"prompt_tokens":true}}"#,
            br#"{"usage":{"prompt_tokens":1,"x":{"prompt_tokens":5,"y":[{"z":null}]}}}"#,
        ];
        for b in bodies {
            assert_eq!(from_json(b), whole(b), "{}", String::from_utf8_lossy(b));
        }
        // Every combination of a few values for the members read, in both families.
        let values = ["7", "0", "null", "\"3\"", "-1", "2.5", "{}", "[1]"];
        for (i, a) in values.iter().enumerate() {
            for b in &values[i..] {
                for (p, c, d, k) in [
                    (
                        "prompt_tokens",
                        "completion_tokens",
                        "prompt_tokens_details",
                        "cached_tokens",
                    ),
                    (
                        "input_tokens",
                        "output_tokens",
                        "output_tokens_details",
                        "reasoning_tokens",
                    ),
                    (
                        "cache_read_input_tokens",
                        "output_tokens",
                        "input_tokens_details",
                        "cached_tokens",
                    ),
                ] {
                    for details in [format!("{{\"{k}\":{a}}}"), b.to_string()] {
                        let body = format!(
                            r#"{{"choices":[{{"text":"{{\"usage\":1}}"}}],"usage":{{"{p}":{a},"{c}":{b},"{d}":{details}}}}}"#
                        );
                        let body = body.as_bytes();
                        assert_eq!(
                            from_json(body),
                            whole(body),
                            "{}",
                            String::from_utf8_lossy(body)
                        );
                    }
                }
            }
        }
        assert_eq!(
            from_json(bodies[0]),
            Some(Usage {
                source: Source::Provider,
                ..Usage::estimate(24, 4)
            })
        );
        assert_eq!(from_json(bodies[1]).map(|u| u.prompt_tokens), Some(2));
    }
}
