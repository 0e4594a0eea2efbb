//! The shape stage: serde errors turned into a [`ConfigError`] naming the JSON path of the field, in
//! words a user knows (`expected a number`, not `expected f64`), and JSON objects whose keys must be
//! distinct ([`UniqueMap`]).

use super::{err, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// A JSON object whose keys must be distinct: serde_json alone keeps the last of two equal keys
/// silently, so `{"models": {"a": …, "a": …}}` would lose an entry without a word.
pub(super) struct UniqueMap<V>(BTreeMap<String, V>);

/// A string, or an array of strings (a claim path spelled `"a.b"` or `["a", "b"]`; a default model or one
/// per route).
pub(super) enum OneOrMany<T> {
    /// One string.
    One(T),
    /// An array of them.
    Many(Vec<T>),
}

impl<'de> Deserialize<'de> for OneOrMany<String> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = OneOrMany<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(OneOrMany::One(v.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(OneOrMany::Many(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl<V> IntoIterator for UniqueMap<V> {
    type Item = (String, V);
    type IntoIter = std::collections::btree_map::IntoIter<String, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, V> IntoIterator for &'a UniqueMap<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = std::collections::btree_map::Iter<'a, String, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<V> Default for UniqueMap<V> {
    fn default() -> Self {
        UniqueMap(BTreeMap::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Keys<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Keys<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<Self::Value, A::Error> {
                let mut map = BTreeMap::new();
                while let Some(key) = access.next_key::<String>()? {
                    if map.contains_key(&key) {
                        // Worded as serde words a repeated struct field, so shape_error treats both alike.
                        return Err(serde::de::Error::custom(format_args!(
                            "duplicate field `{key}`"
                        )));
                    }
                    let value = access.next_value()?;
                    map.insert(key, value);
                }
                Ok(UniqueMap(map))
            }
        }
        d.deserialize_map(Keys(std::marker::PhantomData))
    }
}

/// The `ConfigError` of a serde (shape) error: the JSON path serde_path_to_error tracked names the field,
/// the reason is serde's message in words a user knows (`expected a number`, not `expected f64`).
///
/// * type and value errors: `rules[0].tokens_per_second: invalid type: string "10", expected a number`;
/// * unknown fields: `rules[0].foo: unknown field `foo`, expected one of …` (the path ends at the key);
/// * duplicate and missing fields are reported on the struct by serde: the field is appended to the path
///   (`rules[0].burst: is given more than once`, `breaker.cluster_fallbacks.a.route: is required`);
/// * JSON syntax errors keep serde_json's line and column (the path is where parsing stopped).
pub(super) fn shape_error(e: serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    let mut path = String::new();
    for segment in e.path().iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => {
                if path.is_empty() {
                    path.push_str("configuration");
                }
                path.push_str(&format!("[{index}]"));
            }
            serde_path_to_error::Segment::Map { key } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            // Where a key was not read yet (a syntax error between fields): the path so far.
            serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {}
        }
    }
    let inner = e.inner();
    let full = inner.to_string();
    let at = |path: &str, name: &str| match (path.is_empty(), name.is_empty()) {
        (true, true) => "configuration".to_string(),
        (true, false) => name.to_string(),
        (false, true) => path.to_string(),
        (false, false) => format!("{path}.{name}"),
    };
    if !inner.is_data() {
        // Syntax error or truncated input: the position is what finds it.
        return err(at(&path, ""), full);
    }
    let position = format!(" at line {} column {}", inner.line(), inner.column());
    let msg = full.strip_suffix(position.as_str()).unwrap_or(&full);
    let quoted = |prefix: &str| {
        msg.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix('`'))
            .filter(|name| !name.contains('`'))
    };
    if let Some(name) = quoted("duplicate field `") {
        return err(at(&path, name), "is given more than once");
    }
    if let Some(name) = quoted("missing field `") {
        return err(at(&path, name), "is required");
    }
    err(at(&path, ""), plain_expectation(msg))
}

/// serde's `…, expected f64` in words: Rust type names mean nothing in a JSON config.
fn plain_expectation(msg: &str) -> String {
    const WORDS: [(&str, &str); 7] = [
        ("f64", "a number"),
        ("u64", "an integer >= 0"),
        ("u32", "an integer between 0 and 4294967295"),
        ("i32", "an integer between -2147483648 and 2147483647"),
        ("i64", "an integer"),
        ("a sequence", "an array"),
        ("a map", "a JSON object"),
    ];
    if let Some((head, expected)) = msg.rsplit_once(", expected ") {
        if let Some((_, words)) = WORDS.iter().find(|(rust, _)| *rust == expected) {
            return format!("{head}, expected {words}");
        }
    }
    msg.to_string()
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn unknown_field_is_refused_naming_it() {
        let e = parse_str(r#"{"rules":[{"tokens_per_second":1,"burst":1}],"tenant_heder":"x"}"#)
            .unwrap_err();
        assert_eq!(e.field, "tenant_heder");
        let e =
            parse_str(r#"{"rules":[{"tokens_per_second":1,"burst":1,"brust":3}]}"#).unwrap_err();
        assert_eq!(e.field, "rules[0].brust");
    }

    #[test]
    fn shape_errors_name_the_full_path_of_the_field_in_every_section() {
        for (config, line) in [
            (
                r#"{"rules":[{"tokens_per_second":"10","burst":100}]}"#.to_string(),
                r#"rules[0].tokens_per_second: invalid type: string "10", expected a number"#,
            ),
            (
                with("", r#","models":{"a":{"default_max_tokens":"x"}}"#),
                r#"models.a.default_max_tokens: invalid type: string "x", expected an integer >= 0"#,
            ),
            (
                with(r#","max_wait_ms":-1"#, ""),
                "rules[0].max_wait_ms: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with(r#","max_wait_ms":1.5"#, ""),
                "rules[0].max_wait_ms: invalid type: floating point `1.5`, expected an integer >= 0",
            ),
            (
                r#"{"limits": [{"name": "l", "max_in_flight": 1.5}]}"#.to_string(),
                "limits[0].max_in_flight: invalid type: floating point `1.5`, expected an integer between 0 and 4294967295",
            ),
            (
                with(r#","refund_unused":1"#, ""),
                "rules[0].refund_unused: invalid type: integer `1`, expected a boolean",
            ),
            (
                with("", r#","max_body_bytes":-1"#),
                "max_body_bytes: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with("", r#","max_tenants":-1"#),
                "max_tenants: invalid value: integer `-1`, expected an integer between 0 and 4294967295",
            ),
            (
                with("", r#","invalid_body":{"action":"charge","tokens":-1}"#),
                "invalid_body.tokens: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with("", r#","default_output":{"max_tokens_cap":-1}"#),
                "default_output.max_tokens_cap: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with("", r#","quota":{"tenants":{"t":{"model_limits":{"m":-1}}}}"#),
                "quota.tenants.t.model_limits.m: invalid value: integer `-1`, expected an integer >= 0",
            ),
            (
                with("", r#","quota":{"weights":{"m":{"input":"x"}}}"#),
                r#"quota.weights.m.input: invalid type: string "x", expected a number"#,
            ),
            (
                with("", r#","quota":{"month_offset_minutes":60.5}"#),
                "quota.month_offset_minutes: invalid type: floating point `60.5`, expected an integer between -2147483648 and 2147483647",
            ),
            (
                with("", r#","global_buckets":{"shim_breaker":{"window_ms":-3}}"#),
                "global_buckets.shim_breaker.window_ms: invalid value: integer `-3`, expected an integer >= 0",
            ),
            (
                with("", r#","breaker":{"cluster_fallbacks":{"a":{"cluster":"b","route":1}}}"#),
                "breaker.cluster_fallbacks.a.route: invalid type: integer `1`, expected a string",
            ),
            (
                with("", r#","breaker":{"keys":"cluster"}"#),
                r#"breaker.keys: invalid type: string "cluster", expected an array"#,
            ),
            (
                with("", r#","breaker":{"failure_threshold":0}"#),
                "breaker.failure_threshold: must be >= 1",
            ),
            (
                r#"{"rules":[1]}"#.to_string(),
                "rules[0]: invalid type: integer `1`, expected a rule object",
            ),
            (
                r#"{"rules":{}}"#.to_string(),
                "rules: invalid type: map, expected an array",
            ),
            (
                "null".to_string(),
                "configuration: invalid type: null, expected the plugin configuration as a JSON object",
            ),
        ] {
            assert_eq!(refusal(&config), line, "{config}");
        }
    }

    #[test]
    fn unknown_repeated_and_missing_fields_are_named_with_their_path() {
        let foo = refusal(&with(r#","foo":1"#, ""));
        assert!(
            foo.starts_with("rules[0].foo: unknown field `foo`, expected one of `name`, "),
            "{foo}"
        );
        assert_eq!(
            refusal(&with(r#","burst":1"#, "")),
            "rules[0].burst: is given more than once"
        );
        assert_eq!(
            refusal(&with("", r#","rules":[]"#)),
            "rules: is given more than once"
        );
        assert_eq!(
            refusal(&with("", r#","models":{"a":{},"b":{},"a":{}}"#)),
            "models.a: is given more than once"
        );
        assert_eq!(
            refusal(&with(
                "",
                r#","quota":{"tenants":{"t":{"model_limits":{"m":1,"m":2}}}}"#
            )),
            "quota.tenants.t.model_limits.m: is given more than once"
        );
        assert_eq!(
            refusal(&with(
                "",
                r#","breaker":{"model_fallbacks":{"a":"b","a":"c"}}"#
            )),
            "breaker.model_fallbacks.a: is given more than once"
        );
        assert_eq!(
            refusal(&with(
                "",
                r#","breaker":{"cluster_fallbacks":{"a":{"cluster":"b"}}}"#
            )),
            "breaker.cluster_fallbacks.a.route: is required"
        );
        assert_eq!(
            refusal(&with("", r#","invalid_body":{"tokens":1}"#)),
            "invalid_body.action: is required"
        );
        let probe = refusal(&with("", r#","breaker":{"probe_permits":2}"#));
        assert!(
            probe.starts_with("breaker.probe_permits: unknown field `probe_permits`"),
            "{probe}"
        );
    }

    #[test]
    fn json_syntax_errors_keep_the_position_and_the_path_reached() {
        assert_eq!(
            refusal(r#"{"rules":[{"tokens_per_second":10,"burst":100,}]}"#),
            "rules[0]: trailing comma at line 1 column 47"
        );
        assert_eq!(
            refusal(&format!("{MIN} x")),
            "configuration: trailing characters at line 1 column 50"
        );
        assert_eq!(
            refusal(""),
            "configuration: EOF while parsing a value at line 1 column 0"
        );
        assert_eq!(
            refusal("[1]"),
            "configuration[0]: invalid type: integer `1`, expected a string"
        );
    }
}
