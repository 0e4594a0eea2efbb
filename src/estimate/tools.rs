//! Tool and function definitions, counted the way the providers publish it.
//!
//! OpenAI (chat `tools` / `functions`, Responses `tools`): the method of OpenAI's token-counting
//! guide (the cookbook's `num_tokens_for_tools`, gpt-4o family constants): per function 7, plus the
//! tokens of `name:description` (one trailing full stop dropped); if its `parameters.properties` is
//! not empty, 3, then per property 3 and the tokens of `key:type:description`, and for an `enum`
//! −3 once plus 3 and the item's tokens per item; 12 once for the list. What that method does not
//! look at (nested schemas: a property's `items`, `properties`, `anyOf`, …; the rest of `parameters`:
//! `$defs`, `title`, …; the function's other fields) is counted as its JSON text, and a tool that is
//! not a function (`web_search`, `file_search`, custom tools) as its whole
//! JSON text, so that the count is never lower than the method's.
//!
//! Anthropic (`tools`): each definition as its JSON text, plus the tool-use system prompt Anthropic
//! publishes for its current models, [`ANTHROPIC_TOOL_SYSTEM_TOKENS`], once for a non-empty list.

use serde::de::SeqAccess;
use serde_json::{Map, Value};

use super::shape::{json_tokens, Shape};
use super::text::text_tokens;
use super::{EstimateError, Res};

/// OpenAI: tokens at the start of each function definition.
pub const FUNCTION_INIT: u64 = 7;
/// OpenAI: tokens before the properties of a function with any.
pub const PROPERTIES_INIT: u64 = 3;
/// OpenAI: tokens per property.
pub const PROPERTY_KEY: u64 = 3;
/// OpenAI: tokens taken off once per property with an `enum` (−3 in the method).
pub const ENUM_INIT: u64 = 3;
/// OpenAI: tokens per enum item (besides the item's own).
pub const ENUM_ITEM: u64 = 3;
/// OpenAI: tokens once at the end of a non-empty list of functions.
pub const FUNCTIONS_END: u64 = 12;
/// Anthropic: the system prompt that tool use adds (Claude Sonnet 4 / Opus 4 / 3.7, `tool_choice`
/// `auto` or `none`: 346; `any` or `tool`: 313 — the larger is charged).
pub const ANTHROPIC_TOOL_SYSTEM_TOKENS: u64 = 346;

/// Which provider's method a list of tools is counted by.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Method {
    OpenAi,
    Anthropic,
}

/// `tools` / `functions`: null or an array of definitions (anything else is a bad field).
#[derive(Clone, Copy)]
pub(super) struct Tools {
    pub(super) field: &'static str,
    pub(super) method: Method,
}

impl Tools {
    /// A list counted by OpenAI's method.
    pub(super) fn openai(field: &'static str) -> Tools {
        Tools {
            field,
            method: Method::OpenAi,
        }
    }

    /// A list counted by Anthropic's.
    pub(super) fn anthropic(field: &'static str) -> Tools {
        Tools {
            field,
            method: Method::Anthropic,
        }
    }
}

impl<'de> Shape<'de> for Tools {
    type Out = Res<u64>;
    fn other(self) -> Res<u64> {
        Err(EstimateError::BadField(self.field))
    }
    fn null(self) -> Res<u64> {
        Ok(0)
    }
    fn seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Res<u64>, A::Error> {
        let mut t = 0u64;
        let mut any = false;
        while let Some(v) = a.next_element::<Value>()? {
            any = true;
            let n = match self.method {
                Method::OpenAi => openai_tool_tokens(&v),
                Method::Anthropic => json_tokens(&v),
            };
            t = t.saturating_add(n);
        }
        if any {
            t = t.saturating_add(match self.method {
                Method::OpenAi => FUNCTIONS_END,
                Method::Anthropic => ANTHROPIC_TOOL_SYSTEM_TOKENS,
            });
        }
        Ok(Ok(t))
    }
}

/// One OpenAI tool: a function (`{"type":"function","function":{…}}`, the Responses API's flat
/// `{"type":"function","name":…}`, or a legacy `functions` entry) by OpenAI's method, anything else
/// as its JSON text.
pub(super) fn openai_tool_tokens(v: &Value) -> u64 {
    let Some(o) = v.as_object() else {
        return json_tokens(v);
    };
    let (function, wrapped) = match o.get("function") {
        Some(Value::Object(f)) => (f, true),
        _ => (o, false),
    };
    let name = function.get("name").and_then(Value::as_str);
    let ty = o.get("type").and_then(Value::as_str);
    match (name, ty) {
        (Some(name), None | Some("function")) => {
            let t = function_tokens(name, function);
            if !wrapped {
                return t;
            }
            // The wrapper's other keys, which the method does not look at either.
            o.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "type" | "function"))
                .fold(t, |t, (k, v)| t.saturating_add(key_value_tokens(k, v)))
        }
        _ => json_tokens(v),
    }
}

/// A description as the method writes it: one trailing full stop dropped.
fn description(v: Option<&Value>) -> &str {
    let d = v.and_then(Value::as_str).unwrap_or("");
    d.strip_suffix('.').unwrap_or(d)
}

/// One function definition by OpenAI's method.
fn function_tokens(name: &str, f: &Map<String, Value>) -> u64 {
    let mut t = FUNCTION_INIT.saturating_add(text_tokens(&format!(
        "{name}:{}",
        description(f.get("description"))
    )));
    let parameters = f.get("parameters");
    let properties = parameters
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object);
    if let Some(props) = properties.filter(|p| !p.is_empty()) {
        t = t.saturating_add(PROPERTIES_INIT);
        for (key, p) in props {
            t = t
                .saturating_add(PROPERTY_KEY)
                .saturating_add(property_tokens(key, p));
        }
    }
    // What the method does not look at, as its JSON text: the rest of the schema (`$defs` of nested
    // models, `title`, a top-level `enum`, …; the provider renders and bills it) and the function's
    // other fields. A client could otherwise hide any amount of text there.
    match parameters {
        Some(Value::Object(p)) => {
            for (k, v) in p {
                let counted = match (k.as_str(), v) {
                    ("type", Value::String(t)) => t == "object",
                    ("properties", _) => properties.is_some(),
                    // The property names the method counted, each once (anything else in it is
                    // counted).
                    ("required", Value::Array(names)) => {
                        let mut seen = std::collections::BTreeSet::new();
                        names.iter().all(|n| {
                            n.as_str().is_some_and(|n| {
                                properties.is_some_and(|p| p.contains_key(n)) && seen.insert(n)
                            })
                        })
                    }
                    ("additionalProperties", Value::Bool(_)) => true,
                    _ => false,
                };
                if !counted {
                    t = t.saturating_add(key_value_tokens(k, v));
                }
            }
        }
        Some(Value::Null) | None => {}
        Some(other) => t = t.saturating_add(json_tokens(other)),
    }
    for (k, v) in f {
        let counted = match (k.as_str(), v) {
            ("name" | "parameters", _) | ("description", Value::String(_) | Value::Null) => true,
            ("type", Value::String(t)) => t == "function",
            ("strict", Value::Bool(_)) => true,
            _ => false,
        };
        if !counted {
            t = t.saturating_add(key_value_tokens(k, v));
        }
    }
    t
}

/// A key the method does not count: its text and its value's JSON text.
fn key_value_tokens(k: &str, v: &Value) -> u64 {
    text_tokens(k).saturating_add(json_tokens(v))
}

/// One property of a function's parameters: `key:type:description`, its enum items, and the JSON
/// text of whatever else its schema holds.
fn property_tokens(key: &str, p: &Value) -> u64 {
    let Some(p) = p.as_object() else {
        return text_tokens(key).saturating_add(json_tokens(p));
    };
    let ty = match p.get("type") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => serde_json::to_string(other).unwrap_or_default(),
        None => String::new(),
    };
    let mut t = text_tokens(&format!("{key}:{ty}:{}", description(p.get("description"))));
    if let Some(items) = p.get("enum").and_then(Value::as_array) {
        let mut e = 0u64;
        for item in items {
            let n = match item {
                Value::String(s) => text_tokens(s),
                other => json_tokens(other),
            };
            e = e.saturating_add(ENUM_ITEM).saturating_add(n);
        }
        t = t.saturating_add(e.saturating_sub(ENUM_INIT));
    }
    for (k, v) in p {
        let counted = matches!(
            (k.as_str(), v),
            ("type", _)
                | ("enum", Value::Array(_))
                | ("description", Value::String(_) | Value::Null)
        );
        if !counted {
            t = t
                .saturating_add(text_tokens(k))
                .saturating_add(json_tokens(v));
        }
    }
    t
}
