//! Phase 1, request headers: which requests are metered at all, then the headers steps of the
//! pipeline ([`super::pipeline::AT_HEADERS`]), so that the upstream is never contacted for a request
//! refused here; then what the body phase will need (the request's settlement id, whether
//! `content-length` must go because the body may be rewritten).

use super::answers;
use super::denial::{Denial, Reason};
use super::state::{Meta, Request, Stage};
use super::steps;
use crate::config::Config;
use crate::estimate::{self, ApiKind, PathModel};
use crate::flow::cx::Cx;
use crate::flow::effect::{Effect, Headers, Next};
use crate::flow::metric::Metric;
use crate::reply::{Dec, Family};
use std::borrow::Cow;

/// The API an LLM call is for, from its method and path; `None` for anything else (passed untouched).
/// Query, fragment, `;` parameters of any segment, trailing slashes and ASCII case do not hide an LLM
/// path (an upstream that ignores them must not serve unmetered calls). See [`estimate::route`].
pub fn api_kind(method: Option<&str>, path: Option<&str>) -> Option<ApiKind> {
    estimate::route(method, path).map(|r| r.kind)
}

/// A request path as the filter reads it: without query, fragment and `;` parameters of any segment,
/// in ASCII lower case, without trailing slashes.
pub fn normalized_path(path: Option<&str>) -> Cow<'_, str> {
    let path = path.unwrap_or_default();
    let path = path.split(['?', '#']).next().unwrap_or(path);
    if path.bytes().any(|b| b == b';' || b.is_ascii_uppercase()) {
        let clean: Vec<String> = path
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or(seg).to_ascii_lowercase())
            .collect();
        Cow::Owned(clean.join("/").trim_end_matches('/').to_string())
    } else {
        Cow::Borrowed(path.trim_end_matches('/'))
    }
}

/// Whether a request that is not a metered LLM call could still spend provider usage: any method but
/// `GET`, `HEAD`, `OPTIONS` and `DELETE`, and any request asking for a protocol upgrade (a WebSocket,
/// as OpenAI's Realtime API uses).
fn may_spend(h: &dyn Headers) -> bool {
    !matches!(
        h.get(":method"),
        Some("GET" | "HEAD" | "OPTIONS" | "DELETE")
    ) || upgrade(h)
}

/// Whether the request asks for a protocol upgrade (HTTP/1.1 `upgrade`, HTTP/2 extended CONNECT).
fn upgrade(h: &dyn Headers) -> bool {
    h.get("upgrade").is_some() || h.get(":protocol").is_some()
}

/// The family to answer an unmetered path in: Gemini's or Bedrock's for theirs, Anthropic's for its
/// paths (`…/messages…` but OpenAI Assistants' `…/threads/…`, `…/complete`) or a client that sends
/// `anthropic-version`, else OpenAI's.
fn family_of_path(path: &str, h: &dyn Headers) -> Family {
    if let Some(f) = Family::of_unmetered_path(path) {
        return f;
    }
    if h.get("anthropic-version").is_some()
        || (path.contains("/messages") && !path.contains("/threads/"))
        || path.ends_with("/complete")
    {
        Family::Anthropic
    } else {
        Family::OpenAi
    }
}

impl Request {
    /// Envoy's request-headers callback.
    pub fn on_request_headers(
        &mut self,
        cx: &mut Cx,
        h: &dyn Headers,
        end_of_stream: bool,
    ) -> Next {
        let cfg = cx.cfg;
        // A request asking for a protocol upgrade (a WebSocket) has no body to meter, whatever its path:
        // it is judged as a write on a path that is not metered.
        let route = if upgrade(h) {
            None
        } else {
            estimate::route(h.get(":method"), h.get(":path"))
        };
        steps::identity::strip_headers(cx, h);
        if let Some(b) = &cfg.breaker {
            // Only the filter may steer requests to a fallback cluster, on every path and method (a
            // client-sent value would pick the fallback route for requests the filter passes).
            if h.get(&b.route_header).is_some() {
                cx.fx.push(Effect::RemoveRequestHeader(Cow::Owned(
                    b.route_header.clone(),
                )));
            }
        }
        let Some(route) = route else {
            if may_spend(h) {
                let path = normalized_path(h.get(":path"));
                if !cfg.unmetered.allows(&path) {
                    self.family = family_of_path(&path, h);
                    self.reply_id = reply_id(h, self.id, cx);
                    let method = h.get(":method").unwrap_or_default();
                    let refusal = answers::path_not_metered(method, &path);
                    let d = Denial::new(Reason::PathNotMetered, refusal);
                    return self.deny(cx, &Meta::default(), "", None, d);
                }
            }
            cx.inc(Metric::RequestsPassthrough);
            self.stage = Stage::Passthrough;
            return Next::Continue;
        };
        let kind = route.kind;
        self.family = Family::of(kind);
        self.reply_id = reply_id(h, self.id, cx);
        let mut meta = Meta {
            kind: Some(kind),
            ..Meta::default()
        };
        match path_model(cfg, route.model) {
            Ok(m) => meta.path_model = m,
            Err(d) => return self.deny(cx, &meta, "", None, d),
        }
        meta.azure_v1 = meta.path_model.is_none() && {
            let p = normalized_path(h.get(":path"));
            p.starts_with("/openai/v1/") || p.starts_with("/openai/responses")
        };
        if cfg.reads_responses && h.get("accept-encoding").is_some() {
            // The filter reads the response (usage for settlements and refunds, the end of SSE streams
            // for the breaker): ask the provider for it uncompressed. A compressor filter placed before
            // tokengate still compresses for the client.
            cx.fx.push(Effect::RemoveRequestHeader(Cow::Borrowed(
                "accept-encoding",
            )));
        }
        meta.model_hint = cfg
            .model_header
            .as_deref()
            .and_then(|n| h.get(n))
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        if cfg.quota.is_some() {
            // Names this request's settlement (retries reuse it). Clients can send `x-request-id`, so
            // the reservation makes it unique with the context id and the time of the body phase
            // ([`settlement_id`]; no clock read here).
            let rid = h.get("x-request-id").unwrap_or_default();
            meta.request_id = rid.get(..64).unwrap_or(rid).to_string();
        }

        if let Err(next) = self.check_headers(cx, h, &mut meta) {
            return next;
        }
        drop_length_if_rewritten(cx, h, &mut meta);
        self.stage = Stage::AwaitingBody(Box::new(meta));
        if end_of_stream {
            return self.on_body(cx, &[]);
        }
        Next::Continue
    }
}

/// The model a metered path names, resolved: an Azure deployment's model (`azure_openai`), a Gemini,
/// Vertex AI or Bedrock model id; a deployment `azure_openai` does not list (`unknown_deployment:
/// "refuse"`) or a model the path spells unreadably is refused (400).
fn path_model(cfg: &Config, m: PathModel) -> Result<Option<String>, Box<Denial>> {
    match m {
        PathModel::None => Ok(None),
        PathModel::Model(m) => Ok(Some(m)),
        PathModel::Deployment(d) => match cfg.azure_openai.model_for(&d) {
            Some(m) => Ok(Some(m)),
            None => Err(Denial::new(
                Reason::UnknownDeployment,
                answers::unknown_deployment(&d),
            )),
        },
        PathModel::Unreadable => Err(Denial::new(
            Reason::UnknownDeployment,
            answers::unreadable_path_model(),
        )),
    }
}

/// Envoy does not fix `content-length` after a body rewrite: a request whose body may be rewritten (a
/// quota's usage injection or clamp, a breaker's model fallback, an output limit written into a body
/// without one) is sent without it, chunked. Otherwise the length is kept, and a later rewrite (an
/// output limit above the model's cap) must keep it.
fn drop_length_if_rewritten(cx: &mut Cx, h: &dyn Headers, meta: &mut Meta) {
    let cfg = cx.cfg;
    let drop_length = cfg.quota.is_some()
        || cfg.downgrades()
        || cfg
            .breaker
            .as_ref()
            .is_some_and(|b| !b.model_fallbacks.is_empty())
        || cfg.write_absent_limit
        || (!cfg.refuse_background && meta.kind == Some(ApiKind::Responses));
    if drop_length && h.get("content-length").is_some() {
        cx.fx
            .push(Effect::RemoveRequestHeader(Cow::Borrowed("content-length")));
    } else {
        meta.fixed_length = h
            .get("content-length")
            .and_then(|v| v.trim().parse::<usize>().ok());
    }
}

/// The name of a request's settlement: `<client x-request-id, first 64 bytes>-<context id>-<ns>` (built
/// without `core::fmt`: this runs for every metered request of a tenant with a quota).
pub(in crate::flow) fn settlement_id(client_id: &str, context: u32, now_ns: u64) -> String {
    let client_id = client_id.get(..64).unwrap_or(client_id);
    let (context, now) = (Dec::int(u64::from(context)), Dec::int(now_ns));
    let mut id = String::with_capacity(client_id.len() + 2 + context.as_str().len() + 20);
    for part in [client_id, "-", context.as_str(), "-", now.as_str()] {
        id.push_str(part);
    }
    id
}

/// The id a reply names: the request's `x-request-id` (Envoy sets one on every request unless told
/// not to), else `tg-<context>-<ns>` (the clock is read only then).
fn reply_id(h: &dyn Headers, id: u32, cx: &Cx) -> String {
    match h.get("x-request-id").filter(|v| !v.is_empty()) {
        Some(v) => v.get(..128).unwrap_or(v).to_string(),
        None => format!("tg-{id}-{}", cx.now()),
    }
}

#[cfg(test)]
mod tests {
    use super::settlement_id;

    #[test]
    fn settlement_ids_are_the_client_id_prefix_the_context_and_the_time() {
        let long = "r".repeat(100);
        // 63 ASCII bytes then a 2-byte character: byte 64 is not a boundary, the whole id is kept.
        let split = format!("{}é{}", "a".repeat(63), "b".repeat(10));
        for (client, ctx, now) in [
            ("", 0u32, 0u64),
            ("abc", 7, 1_794_700_800_123_456_789),
            (long.as_str(), u32::MAX, u64::MAX),
            (split.as_str(), 3, 42),
        ] {
            let want = format!("{}-{ctx}-{now}", client.get(..64).unwrap_or(client));
            assert_eq!(settlement_id(client, ctx, now), want);
        }
        assert_eq!(settlement_id(&long, 1, 2).len(), 64 + 4);
    }
}
