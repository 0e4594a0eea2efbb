//! Reading step: what is sent upstream. The body is edited in place, byte-preserving
//! ([`crate::rewrite`]): a breaker's fallback model; `stream_options.include_usage` added to a chat or
//! completions stream when a quota must settle it; an output limit above the model's cap lowered to it
//! (or refused, `output_above_cap: "refuse"`), and one written into a body without any where the
//! reservation must bound what the provider generates — each in the family's own field ([`limit_at`]:
//! Gemini's `generationConfig.maxOutputTokens`, Converse's `inferenceConfig.maxTokens`, …). A body
//! whose `content-length` was kept is padded to it, or refused when the edit would make it longer.

use crate::config::{AboveCap, Config};
use crate::estimate::ApiKind;
use crate::flow::cx::Cx;
use crate::flow::effect::{Effect, Level};
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::step::Draft;
use crate::reply::Refusal;
use crate::rewrite::{self, Edits, LimitAt};

/// The body field that carries the output limit for this API, where one is added to a body without
/// any: chat's `max_completion_tokens` (OpenAI's reasoning models refuse `max_tokens`), unless the body
/// already names `max_tokens` (a `null` one: the client's style).
pub(in crate::flow) fn output_field(kind: ApiKind, body: &[u8]) -> &'static str {
    match kind {
        ApiKind::Responses => "max_output_tokens",
        ApiKind::ChatCompletions if !body.windows(12).any(|w| w == b"\"max_tokens\"") => {
            "max_completion_tokens"
        }
        _ => "max_tokens",
    }
}

/// Where the body of `kind` keeps its output limit ([`LimitAt`]): Gemini's `generationConfig`,
/// Converse's `inferenceConfig`, Bedrock `invoke`'s model body (`path_model`: the model id the path
/// names, which tells Nova's bodies apart), else the top level ([`output_field`]).
pub(in crate::flow) fn limit_at(kind: ApiKind, path_model: Option<&str>) -> LimitAt {
    match kind {
        ApiKind::GeminiGenerate | ApiKind::GeminiStream => LimitAt::Gemini,
        ApiKind::BedrockConverse | ApiKind::BedrockConverseStream => LimitAt::Converse,
        ApiKind::BedrockInvoke | ApiKind::BedrockInvokeStream => LimitAt::Invoke {
            nova: path_model.is_some_and(|m| m.to_ascii_lowercase().contains("nova")),
        },
        _ => LimitAt::Top,
    }
}

/// The edits' description of where the output limit goes, for `kind` and `body`.
pub(in crate::flow) fn limit_edits(
    kind: ApiKind,
    body: &[u8],
    path_model: Option<&str>,
    edits: &mut Edits,
) {
    edits.max_output_field = output_field(kind, body).to_string();
    edits.limit_at = limit_at(kind, path_model);
}

/// Edits the body of `d` (the effect replaces Envoy's buffer).
pub(in crate::flow) fn apply(cx: &mut Cx, d: &mut Draft) -> Result<(), Box<Denial>> {
    let cfg = cx.cfg;
    let (kind, body) = (d.kind, d.body);
    let hint = d.meta.model_hint.as_deref();
    if let (Some(q), Some(e)) = (&cfg.quota, &d.est) {
        // Only OpenAI chat and legacy completions know `stream_options.include_usage` (their streams
        // carry no usage without it); Anthropic's and Responses' streams always end with their usage,
        // and their APIs refuse fields they do not define.
        d.edits.inject_include_usage = q.inject_stream_usage
            && e.stream
            && !e.include_usage
            && matches!(e.kind, ApiKind::ChatCompletions | ApiKind::Completions);
        limit_edits(kind, body, d.meta.path_model.as_deref(), &mut d.edits);
    }
    if let Some(e) = d.est.as_ref().filter(|e| e.kind != ApiKind::Embeddings) {
        // The reservation covers at most the model's cap per choice: a body asking for more is lowered
        // to it, so that the provider never generates more than was reserved.
        let cap = cfg.output_limits(e.model.as_deref().or(hint)).cap_tokens;
        if e.output_tokens >= cap.saturating_mul(e.output_choices.max(1)) {
            d.edits.clamp_max_output = Some(cap);
            d.edits.clamp_present_only = true;
            limit_edits(kind, body, d.meta.path_model.as_deref(), &mut d.edits);
        }
    }
    // A body without an output limit gets the reserved one written in where the reservation must bound
    // what the provider generates: `output_limit_absent: "write"`, and a background response
    // (`background_responses: "reservation"`: charged its reservation, whatever it generates).
    let adds_limit = d.est.as_ref().is_some_and(|e| {
        e.kind != ApiKind::Embeddings
            && e.requested_output.is_none()
            && (e.background || cfg.write_absent_limit)
    });
    if let Some(e) = d.est.as_ref().filter(|_| adds_limit) {
        d.edits.clamp_max_output = Some(e.output_tokens / e.output_choices.max(1));
        d.edits.clamp_present_only = false;
        limit_edits(kind, body, d.meta.path_model.as_deref(), &mut d.edits);
    }
    // Kept for a max_tokens clamp after the reservation, and for a model downgrade.
    let keep = cfg.quota.is_some() || cfg.downgrades();
    if keep {
        d.kept = body.to_vec();
    }
    if d.edits.set_model.is_none()
        && !d.edits.inject_include_usage
        && d.edits.clamp_max_output.is_none()
    {
        return Ok(());
    }
    match rewrite::rewrite_with_report(body, &d.edits) {
        Ok(r) => {
            if r.output_clamped && !adds_limit {
                if let Some(refusal) = above_cap(cfg, &r, d.edits.clamp_max_output) {
                    return Err(Denial::new(Reason::OutputAboveCap, refusal));
                }
                cx.inc(Metric::RequestsOutputCapped);
            }
            if let Some(mut new_body) = r.body {
                if let Some(n) = d.meta.fixed_length {
                    // The upstream was promised `n` bytes (content-length kept): JSON allows trailing
                    // whitespace, so a shorter body is padded to exactly that.
                    if new_body.len() > n {
                        return Err(Denial::new(
                            Reason::OutputDoesNotFit,
                            answers::output_limit_too_large(
                                d.edits.clamp_max_output.unwrap_or(0),
                                "a plain integer of at most",
                            ),
                        ));
                    }
                    new_body.resize(n, b' ');
                }
                if keep {
                    d.kept.clone_from(&new_body);
                }
                cx.fx.push(Effect::ReplaceRequestBody(new_body));
            }
            if r.model_changed {
                cx.inc(Metric::BreakerFallbacks);
                if let Some(t) = d.edits.set_model.take() {
                    d.model = t;
                }
            }
            d.injected_usage = r.injected_include_usage;
        }
        Err(e) => {
            cx.log_failure(
                Level::Warn,
                "rewrite_body",
                format!("cannot rewrite the request body: {e}"),
            );
            if d.edits.set_model.is_some() {
                return Err(Denial::new(
                    Reason::CircuitOpen,
                    answers::circuit_open("model", &d.model, 1000),
                ));
            }
        }
    }
    Ok(())
}

/// The refusal of a body whose output limit is above the cap (`output_above_cap: refuse`), or whose
/// thinking budget cannot fit below the cap; `None` to lower it.
fn above_cap(cfg: &Config, r: &rewrite::Rewritten, cap: Option<u64>) -> Option<Refusal> {
    let cap = cap.unwrap_or(0);
    if let rewrite::Thinking::DoesNotFit { max_tokens } = r.thinking {
        return Some(answers::thinking_does_not_fit(max_tokens));
    }
    (cfg.output_above_cap == AboveCap::Refuse)
        .then(|| answers::output_limit_too_large(cap, "at most"))
}
