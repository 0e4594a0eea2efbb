//! Request body rewrites: set the model, inject `stream_options.include_usage`, clamp the output limit
//! (keeping an Anthropic thinking budget below it). Pure: bytes in, bytes out (or `None` when nothing
//! changes, so the host leaves the body alone).
//!
//! # Why
//! * Routing to a fallback model changes `model`.
//! * OpenAI streams report usage only with `stream_options.include_usage = true`; the filter injects it
//!   to settle quotas exactly, and [`crate::usage::SseScanner`] strips the extra chunk again.
//! * A reservation admitted with less output than asked ([`crate::quota::Reason::Clamped`], or a
//!   `max_tokens` above the model's cap) must lower the request's output limit to what was reserved.
//!   Each API family keeps it in its own place ([`LimitAt`]): OpenAI's and Anthropic's at the top,
//!   Gemini's in `generationConfig`, Bedrock Converse's in `inferenceConfig`, Bedrock `invoke`'s where
//!   the model's own body has it.
//! * Anthropic refuses extended thinking unless `thinking.budget_tokens < max_tokens` (and the budget is
//!   at least [`MIN_THINKING_BUDGET`]): a clamp lowers the budget with it, or says that none fits
//!   ([`Thinking::DoesNotFit`]) so the flow can refuse the request itself.
//!
//! # Byte-preserving edits
//! The body is not re-serialized. A strict scanner (`scan`, which refuses everything serde_json refuses)
//! finds the byte span of each top-level member's value, and only the edited values' bytes are
//! replaced; a missing member is inserted after the last member (`,"key":value`), or after the `{` of
//! an empty object. Key order, whitespace, number spelling (`1e3`, `2.50`), escapes and everything else
//! stay byte for byte what the client sent: tool and `response_format` JSON schemas keep their
//! `properties` order (the order structured outputs come back in) and prompt-cache prefixes do not
//! move. New values are written compactly (`"stream_options":{"include_usage":true}`).
//!
//! # Duplicate keys
//! JSON readers disagree on duplicate keys; serde_json, Python's `json`, Go's `encoding/json` and
//! JavaScript's `JSON.parse` keep the **last** occurrence, and so does every decision here (is `stream`
//! true, what is the current `model` or `max_tokens`, is `thinking` enabled). The rule for writing:
//! * a top-level value that is set (`model`, each output-limit field, or `stream_options` when it is
//!   replaced whole) is written into **every** occurrence of its key, so that a reader that keeps the
//!   first occurrence sees the new value too (the output limit must hold for every reader);
//! * an edit inside an object (`stream_options.include_usage`, `thinking.budget_tokens`) is made in the
//!   last occurrence of that object, to every occurrence of the inner key there.
//!
//! Parsing the result with serde_json gives what parsing the original gives, except for the edits.
//!
//! # Example
//! ```
//! # use tokengate::rewrite::*;
//! let edits = Edits { inject_include_usage: true, clamp_max_output: Some(100), ..Edits::default() };
//! let body = br#"{"model": "m", "stream": true, "max_tokens": 4096, "temperature": 1.0}"#;
//! let out = rewrite(body, &edits).unwrap().unwrap();
//! assert_eq!(
//!     out,
//!     br#"{"model": "m", "stream": true, "max_tokens": 100, "temperature": 1.0,"stream_options":{"include_usage":true}}"#
//! );
//!
//! // Anthropic extended thinking: the budget is lowered below the clamped max_tokens.
//! let edits = Edits { clamp_max_output: Some(2000), ..Edits::default() };
//! let body = br#"{"max_tokens":8000,"thinking":{"type":"enabled","budget_tokens":4000}}"#;
//! let r = rewrite_with_report(body, &edits).unwrap();
//! assert_eq!(r.thinking, Thinking::Lowered { budget: 1999 });
//! assert_eq!(r.body.unwrap(), br#"{"max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":1999}}"#);
//! ```

mod scan;

pub(crate) use scan::hex4;

use scan::{Document, Member, Object};
use std::ops::Range;

/// Every field name an API uses for the output limit (chat: `max_tokens` or `max_completion_tokens`,
/// legacy completions: `max_tokens`, responses: `max_output_tokens`, Anthropic: `max_tokens`).
pub const MAX_OUTPUT_FIELDS: [&str; 3] =
    ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// Anthropic's smallest `thinking.budget_tokens`.
pub const MIN_THINKING_BUDGET: u64 = 1024;

/// The output limits of the `invoke` bodies of Bedrock models whose shape the filter does not know
/// (Llama `max_gen_len`, Titan `maxTokenCount`, Mistral and Cohere `max_tokens`, AI21 `maxTokens`, …):
/// the fields the estimate reads the output from (`estimate::bedrock`), lowered where present.
pub const INVOKE_OUTPUT_FIELDS: [&str; 7] = [
    "max_tokens",
    "max_completion_tokens",
    "max_tokens_to_sample",
    "max_gen_len",
    "max_new_tokens",
    "maxTokenCount",
    "maxTokens",
];

/// Where a body keeps its output limit, by API family.
///
/// | family | lowered where present | written when absent | thinking budget kept below it |
/// |---|---|---|---|
/// | [`Top`](LimitAt::Top): OpenAI, Anthropic, Azure | top-level [`MAX_OUTPUT_FIELDS`] | `max_output_field` | `thinking.budget_tokens` |
/// | [`Gemini`](LimitAt::Gemini) | `generationConfig.maxOutputTokens` (either spelling of both) | `maxOutputTokens` in the last `generationConfig`, or a new `"generationConfig":{"maxOutputTokens":N}` | — (Gemini counts thinking inside the limit) |
/// | [`Converse`](LimitAt::Converse) | `inferenceConfig.maxTokens` | likewise in `inferenceConfig` | `additionalModelRequestFields.thinking.budget_tokens` |
/// | [`Invoke`](LimitAt::Invoke), Anthropic body (`anthropic_version`) | as `Top` | `max_tokens` | `thinking.budget_tokens` |
/// | `Invoke`, Nova body (`schemaVersion`, or `messages` for a Nova model) | `inferenceConfig.max_new_tokens` | likewise | — |
/// | `Invoke`, any other body | [`INVOKE_OUTPUT_FIELDS`] at the top and in every object one level down | nothing (the model's field is not known) | — |
///
/// A limit in an object is lowered in every occurrence of that object (either spelling of its key), so
/// that every JSON reader sees it; an object that is `null` is replaced by one holding the limit; one
/// that is not an object at all is left as sent (the provider refuses that body).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitAt {
    /// At the top level (OpenAI, Anthropic, Azure OpenAI).
    #[default]
    Top,
    /// Gemini API / Vertex AI.
    Gemini,
    /// Bedrock Converse.
    Converse,
    /// Bedrock `invoke`: the model's own body, told apart by its fields.
    Invoke {
        /// The path's model id names Amazon Nova (a `messages` body is then Nova's).
        nova: bool,
    },
}

/// An output limit held in an object of the body.
struct Nested {
    /// Spellings of the object's key; the first is the one written.
    parent: &'static [&'static str],
    /// Spellings of the limit inside it; every one present is lowered.
    names: &'static [&'static str],
    /// The name written when the object holds none (`None`: never written).
    write: Option<&'static str>,
}

const GEMINI: Nested = Nested {
    parent: &["generationConfig", "generation_config"],
    names: &["maxOutputTokens", "max_output_tokens"],
    write: Some("maxOutputTokens"),
};

const CONVERSE: Nested = Nested {
    parent: &["inferenceConfig"],
    names: &["maxTokens", "max_new_tokens"],
    write: Some("maxTokens"),
};

const NOVA: Nested = Nested {
    parent: &["inferenceConfig"],
    names: &["max_new_tokens", "maxTokens"],
    write: Some("max_new_tokens"),
};

/// The changes to apply. [`Edits::default`] changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edits {
    /// Replace `model` with this name.
    pub set_model: Option<String>,
    /// Set `stream_options.include_usage = true` when `stream` is `true` and it is not already true
    /// (other `stream_options` fields are kept). Only OpenAI chat/completions understand it.
    pub inject_include_usage: bool,
    /// Lower every present output-limit field (where [`limit_at`](Edits::limit_at) says; at the top:
    /// [`MAX_OUTPUT_FIELDS`]) above this value to it; when none is present (or all are `null`), write
    /// one (at the top: `max_output_field`). When this changes the body and an
    /// enabled `thinking` budget is not below the new limit, the budget is lowered too (see
    /// [`Thinking`]).
    pub clamp_max_output: Option<u64>,
    /// Field to add at the top level ([`LimitAt::Top`]) when the body has no output limit: `max_tokens`
    /// (chat, completions, Anthropic) or `max_output_tokens` (responses).
    pub max_output_field: String,
    /// With `clamp_max_output`: only lower the limits present, never add one (the cap of a model is
    /// enforced on what the client asked; a body without a limit is left to the provider's default).
    pub clamp_present_only: bool,
    /// Where the body keeps its output limit (its API family); `max_output_field` is used at the top.
    pub limit_at: LimitAt,
}

impl Default for Edits {
    fn default() -> Self {
        Self {
            set_model: None,
            inject_include_usage: false,
            clamp_max_output: None,
            max_output_field: "max_tokens".to_string(),
            clamp_present_only: false,
            limit_at: LimitAt::Top,
        }
    }
}

/// What a clamp did to an extended-thinking budget (`"thinking": {"type": "enabled", "budget_tokens":
/// N}`, Anthropic's shape, also accepted by Anthropic's OpenAI-compatible endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Thinking {
    /// No clamp, no enabled thinking, or its budget was already below the new output limit.
    #[default]
    Untouched,
    /// `budget_tokens` was lowered to this (the new output limit − 1).
    Lowered {
        /// The new budget.
        budget: u64,
    },
    /// No budget of at least [`MIN_THINKING_BUDGET`] fits below the new output limit: Anthropic would
    /// refuse the request. The budget is left as sent; the body must not be forwarded (the flow refuses
    /// with `invalid_request_error`, [`crate::reply::Class::ThinkingBudgetDoesNotFit`]).
    DoesNotFit {
        /// The output limit after the clamp.
        max_tokens: u64,
    },
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
    /// What the clamp did to an extended-thinking budget.
    pub thinking: Thinking,
}

/// Applies `edits` to a JSON request body. `Ok(None)`: nothing to change. `Err`: the body is not a JSON
/// object (the message says why; nothing is edited).
pub fn rewrite(body: &[u8], edits: &Edits) -> Result<Option<Vec<u8>>, String> {
    rewrite_with_report(body, edits).map(|r| r.body)
}

/// Same as [`rewrite`], also telling which edits took effect.
pub fn rewrite_with_report(body: &[u8], edits: &Edits) -> Result<Rewritten, String> {
    let (report, plan) = plan(body, edits)?;
    Ok(Rewritten {
        body: if plan.splices.is_empty() {
            None
        } else {
            Some(plan.apply()?)
        },
        ..report
    })
}

/// The report and the splices for `edits` (`report.body` is `None`).
fn plan<'a>(body: &'a [u8], edits: &Edits) -> Result<(Rewritten, Plan<'a>), String> {
    let obj = match scan::document(body) {
        Ok(Document::Object(o)) => o,
        Ok(Document::NotObject) => return Err("body is not a JSON object".to_string()),
        Err(e) => return Err(format!("body is not JSON: {} at byte {}", e.what, e.at)),
    };
    let mut plan = Plan {
        body,
        splices: Vec::new(),
    };
    let mut report = Rewritten::default();
    if let Some(model) = &edits.set_model {
        let current = plan
            .last(&obj, "model")
            .and_then(|m| scan::string_value(body, &m.value));
        if current.as_deref() != Some(model.as_str()) {
            plan.set(&obj, "model", json_string(model));
            report.model_changed = true;
        }
    }
    if edits.inject_include_usage {
        report.injected_include_usage = plan.inject_include_usage(&obj);
    }
    if let Some(max) = edits.clamp_max_output {
        let add = !edits.clamp_present_only;
        let has = |k: &str| obj.members.iter().any(|m| scan::key_is(body, m, k));
        // The limit, and whether an Anthropic thinking budget must stay below it: at the top
        // (`thinking`), in Converse's `additionalModelRequestFields.thinking`, or nowhere.
        let (limit, thinking) = match edits.limit_at {
            LimitAt::Top => (
                plan.clamp(&obj, max, add.then_some(edits.max_output_field.as_str())),
                Holder::Top,
            ),
            LimitAt::Gemini => (plan.clamp_nested(&obj, &GEMINI, max, add), Holder::None),
            LimitAt::Converse => (
                plan.clamp_nested(&obj, &CONVERSE, max, add),
                plan.last(&obj, "additionalModelRequestFields")
                    .and_then(|m| scan::object_at(body, &m.value))
                    .map_or(Holder::None, Holder::In),
            ),
            LimitAt::Invoke { .. } if has("anthropic_version") => (
                plan.clamp(&obj, max, add.then_some("max_tokens")),
                Holder::Top,
            ),
            LimitAt::Invoke { nova } if has("schemaVersion") || (nova && has("messages")) => {
                (plan.clamp_nested(&obj, &NOVA, max, add), Holder::None)
            }
            LimitAt::Invoke { .. } => (plan.clamp_any_known(&obj, max), Holder::None),
        };
        if let Some(limit) = limit {
            report.output_clamped = true;
            report.thinking = match &thinking {
                Holder::Top => plan.fit_thinking(&obj, limit),
                Holder::In(o) => plan.fit_thinking(o, limit),
                Holder::None => Thinking::Untouched,
            };
        }
    }
    Ok((report, plan))
}

/// The object whose `thinking` member must keep its budget below a clamped limit.
enum Holder {
    /// The body's top level.
    Top,
    /// This object (Converse's `additionalModelRequestFields`).
    In(Object),
    /// None: the family has no such rule.
    None,
}

/// A JSON string literal.
fn json_string(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).unwrap_or_else(|_| b"\"\"".to_vec())
}

/// A value that is a plain non-negative integer fitting u64 (what `serde_json::Value::as_u64` gives
/// `Some` for); `None` for anything else (`1e3`, `100.0`, `-1`, strings).
fn plain_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// Replace `range` of the body with `text` (an insertion when the range is empty).
#[derive(Debug)]
struct Splice {
    range: Range<usize>,
    text: Vec<u8>,
}

/// The splices to make in one body.
struct Plan<'a> {
    body: &'a [u8],
    splices: Vec<Splice>,
}

impl<'a> Plan<'a> {
    /// The occurrence of `key` in `obj` that serde_json reads (the last).
    fn last<'o>(&self, obj: &'o Object, key: &str) -> Option<&'o Member> {
        obj.members
            .iter()
            .rev()
            .find(|m| scan::key_is(self.body, m, key))
    }

    /// The bytes of a value.
    fn bytes(&self, m: &Member) -> &'a [u8] {
        self.body.get(m.value.clone()).unwrap_or_default()
    }

    /// Sets `key` to `value` in every occurrence, or inserts it when there is none.
    fn set(&mut self, obj: &Object, key: &str, value: Vec<u8>) {
        let mut found = false;
        for m in obj
            .members
            .iter()
            .filter(|m| scan::key_is(self.body, m, key))
        {
            found = true;
            self.splices.push(Splice {
                range: m.value.clone(),
                text: value.clone(),
            });
        }
        if found {
            return;
        }
        let (at, comma) = match obj.members.last() {
            Some(m) => (m.value.end, true),
            // An empty object: a comma only after a member inserted before this one.
            None => {
                let at = obj.open + 1;
                (at, self.splices.iter().any(|s| s.range == (at..at)))
            }
        };
        let mut text = Vec::with_capacity(key.len() + value.len() + 4);
        if comma {
            text.push(b',');
        }
        text.extend_from_slice(&json_string(key));
        text.push(b':');
        text.extend_from_slice(&value);
        self.splices.push(Splice {
            range: at..at,
            text,
        });
    }

    /// `stream_options.include_usage = true` for a stream; whether the body changes.
    fn inject_include_usage(&mut self, obj: &Object) -> bool {
        let stream = self.last(obj, "stream").map(|m| self.bytes(m));
        if stream != Some(b"true") {
            return false;
        }
        let Some(so) = self.last(obj, "stream_options") else {
            self.set(obj, "stream_options", b"{\"include_usage\":true}".to_vec());
            return true;
        };
        if self.bytes(so) == b"null" {
            self.set(obj, "stream_options", b"{\"include_usage\":true}".to_vec());
            return true;
        }
        // Not an object: the provider will reject the request anyway; leave it as the client sent it.
        let Some(inner) = scan::object_at(self.body, &so.value) else {
            return false;
        };
        if self.last(&inner, "include_usage").map(|m| self.bytes(m)) == Some(b"true") {
            return false;
        }
        self.set(&inner, "include_usage", b"true".to_vec());
        true
    }

    /// Lowers the top-level output limits ([`MAX_OUTPUT_FIELDS`]) above `max` (or adds
    /// `field_if_absent`); the resulting limit (the smallest present) when the body changes, else `None`.
    fn clamp(&mut self, obj: &Object, max: u64, field_if_absent: Option<&str>) -> Option<u64> {
        self.clamp_fields(obj, &MAX_OUTPUT_FIELDS, max, field_if_absent)
    }

    /// Lowers the limits `n.names` above `max` in every occurrence of the object `n.parent` (and adds
    /// `n.write` to each that holds none, with `add`); with no such object, adds one holding the
    /// limit (in place of a `null` one). The resulting limit (the smallest) when the body changes.
    fn clamp_nested(&mut self, obj: &Object, n: &Nested, max: u64, add: bool) -> Option<u64> {
        let write = n.write.filter(|_| add);
        let digits = max.to_string().into_bytes();
        let mut changed = false;
        let mut limit = u64::MAX;
        let mut objects = 0;
        let mut null_key = None;
        let mut unreadable = false;
        for m in obj
            .members
            .iter()
            .filter(|m| n.parent.iter().any(|p| scan::key_is(self.body, m, p)))
        {
            let Some(inner) = scan::object_at(self.body, &m.value) else {
                if self.bytes(m) == b"null" {
                    null_key = n.parent.iter().find(|p| scan::key_is(self.body, m, p));
                } else {
                    unreadable = true;
                }
                continue;
            };
            objects += 1;
            if let Some(l) = self.clamp_fields(&inner, n.names, max, write) {
                changed = true;
                limit = limit.min(l);
            } else if let Some(l) = self.present_limit(&inner, n.names) {
                limit = limit.min(l);
            }
        }
        if objects == 0 {
            // Not an object (nor `null`): the provider refuses the body; it is left as sent.
            let field = write.filter(|_| !unreadable)?;
            let mut value = Vec::with_capacity(field.len() + digits.len() + 5);
            value.push(b'{');
            value.extend_from_slice(&json_string(field));
            value.push(b':');
            value.extend_from_slice(&digits);
            value.push(b'}');
            // A `null` object is replaced (in that spelling); else the first spelling is added.
            let key = null_key.or(n.parent.first())?;
            self.set(obj, key, value);
            return Some(max);
        }
        changed.then_some(limit)
    }

    /// Lowers every field of `names` present in `obj` above `max`; adds `add` when none is present.
    /// The resulting limit (the smallest present) when the body changes.
    fn clamp_fields(
        &mut self,
        obj: &Object,
        names: &[&str],
        max: u64,
        add: Option<&str>,
    ) -> Option<u64> {
        let mut present = false;
        let mut changed = false;
        let mut limit = u64::MAX;
        let digits = max.to_string().into_bytes();
        for f in names {
            let Some(m) = self.last(obj, f) else { continue };
            let v = self.bytes(m);
            if v == b"null" {
                continue;
            }
            present = true;
            // A non-integer or larger value is replaced: the reservation only covers `max`.
            match plain_u64(v) {
                Some(n) if n <= max => limit = limit.min(n),
                _ => {
                    self.set(obj, f, digits.clone());
                    changed = true;
                    limit = limit.min(max);
                }
            }
        }
        if let (false, Some(field)) = (present, add) {
            self.set(obj, field, digits);
            changed = true;
            limit = max;
        }
        changed.then_some(limit)
    }

    /// The smallest plain-integer limit of `names` in `obj`, if any.
    fn present_limit(&self, obj: &Object, names: &[&str]) -> Option<u64> {
        names
            .iter()
            .filter_map(|f| self.last(obj, f))
            .filter_map(|m| plain_u64(self.bytes(m)))
            .min()
    }

    /// An `invoke` body of a shape the filter does not know: every [`INVOKE_OUTPUT_FIELDS`] present
    /// at the top and in each object one level down is lowered to `max`; nothing is added.
    fn clamp_any_known(&mut self, obj: &Object, max: u64) -> Option<u64> {
        let mut changed = false;
        let mut limit = u64::MAX;
        let nested: Vec<Object> = obj
            .members
            .iter()
            .filter_map(|m| scan::object_at(self.body, &m.value))
            .collect();
        for o in std::iter::once(obj).chain(nested.iter()) {
            if let Some(l) = self.clamp_fields(o, &INVOKE_OUTPUT_FIELDS, max, None) {
                changed = true;
                limit = limit.min(l);
            }
        }
        changed.then_some(limit)
    }

    /// Keeps an enabled thinking budget below the output limit `limit`.
    fn fit_thinking(&mut self, obj: &Object, limit: u64) -> Thinking {
        let Some(t) = self.last(obj, "thinking") else {
            return Thinking::Untouched;
        };
        let Some(inner) = scan::object_at(self.body, &t.value) else {
            return Thinking::Untouched;
        };
        let enabled = self
            .last(&inner, "type")
            .and_then(|m| scan::string_value(self.body, &m.value));
        if enabled.as_deref() != Some("enabled") {
            return Thinking::Untouched;
        }
        let Some(b) = self.last(&inner, "budget_tokens") else {
            return Thinking::Untouched;
        };
        let Some(budget) = serde_json::from_slice::<serde_json::Number>(self.bytes(b))
            .ok()
            .and_then(|n| n.as_f64())
        else {
            return Thinking::Untouched;
        };
        if budget < limit as f64 {
            return Thinking::Untouched;
        }
        let fits = limit.saturating_sub(1);
        if fits < MIN_THINKING_BUDGET {
            return Thinking::DoesNotFit { max_tokens: limit };
        }
        self.set(&inner, "budget_tokens", fits.to_string().into_bytes());
        Thinking::Lowered { budget: fits }
    }

    /// The body with every splice made.
    fn apply(mut self) -> Result<Vec<u8>, String> {
        // Stable: insertions at one offset keep the order they were planned in.
        self.splices.sort_by_key(|s| s.range.start);
        let extra: usize = self.splices.iter().map(|s| s.text.len()).sum();
        let mut out = Vec::with_capacity(self.body.len() + extra);
        let mut at = 0;
        for s in &self.splices {
            let kept = self
                .body
                .get(at..s.range.start)
                .ok_or("overlapping body edits")?;
            out.extend_from_slice(kept);
            out.extend_from_slice(&s.text);
            at = s.range.end;
        }
        out.extend_from_slice(self.body.get(at..).unwrap_or_default());
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
