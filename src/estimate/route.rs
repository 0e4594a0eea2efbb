//! Which metered API a request is for, and the model its path names: [`route`].
//!
//! Three families name the model in the path rather than in the body:
//!
//! | family | paths (POST) | [`ApiKind`] | model ([`PathModel`]) |
//! |---|---|---|---|
//! | Azure OpenAI | `…/openai/deployments/{deployment}/chat/completions` (also `/completions`, `/embeddings`, `/extensions/chat/completions`) | the OpenAI kind of the suffix | `Deployment(deployment)`: a deployment name, mapped to a model by the `azure_openai` config |
//! | Gemini API | `…/models/{model}:generateContent`, `:streamGenerateContent` (`/v1beta/models/gemini-2.5-flash:generateContent`, also `tunedModels/{m}`) | `GeminiGenerate`, `GeminiStream` | `Model(model)` (`tunedModels/{m}` for a tuned model) |
//! | Vertex AI | `…/projects/{p}/locations/{l}/publishers/google/models/{model}:generateContent` / `:streamGenerateContent`, express mode `…/publishers/google/models/{model}:…`, `…/endpoints/{id}:…` | as Gemini | `Model(model)` (`endpoints/{id}` for an endpoint) |
//! | Vertex AI, Claude | `…/publishers/anthropic/models/{model}:rawPredict` / `:streamRawPredict` (an Anthropic Messages body without `model`) | `AnthropicMessages` | `Model(model)` |
//! | Bedrock | `…/model/{modelId}/converse`, `/converse-stream`, `/invoke`, `/invoke-with-response-stream` | `BedrockConverse`, `BedrockConverseStream`, `BedrockInvoke`, `BedrockInvokeStream` | `Model(modelId)`: percent-decoded (`anthropic.claude-3-5-haiku-20241022-v1%3A0`, an ARN with `%2F` or with its `/` left raw) |
//!
//! Every other metered path is read as before ([`ApiKind::from_path`] on the path without query,
//! fragment, `;` parameters, case and trailing slashes), with [`PathModel::None`]: the body names
//! the model. The same robustness holds for the new families: query strings (`?alt=sse`,
//! `?api-version=…`, `?key=…`), fragments, `;` parameters of any segment, ASCII case of the
//! fixed parts and trailing slashes never hide a metered path, and a percent-encoded `:` before the
//! verb (`%3AgenerateContent`) is read as `:`. The model keeps its case (model ids and deployment
//! names are the provider's).
//!
//! Token counting spends nothing: Gemini `:countTokens`, Vertex `:computeTokens`, Bedrock
//! `/model/{id}/count-tokens` and Vertex Claude's `publishers/anthropic/models/count-tokens:rawPredict`
//! are not metered (`None` here); `unmetered_paths` lets them pass (built-in patterns). Other verbs that
//! spend (`:embedContent`, `:batchEmbedContents`, `:predict`, Bedrock `/async-invoke`) are not metered
//! either: as any write on a path that is not metered, they are refused (`path_not_metered`) unless
//! `unmetered_paths` allows them.
//!
//! A model the filter cannot read from the path — empty, over [`MAX_PATH_MODEL_LEN`] bytes once
//! decoded, a bad percent escape, not UTF-8, or holding a control character — is
//! [`PathModel::Unreadable`]: the request is refused (400) rather than charged under a name that is not
//! the one the provider reads.

use super::ApiKind;

/// Longest model or deployment name read from a path, in bytes once percent-decoded (a Bedrock ARN
/// of an application inference profile is about 100 bytes).
pub const MAX_PATH_MODEL_LEN: usize = 256;

/// The model a request path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathModel {
    /// The path names none: the body's `model` (or the model header) says it.
    None,
    /// An Azure OpenAI deployment (`…/openai/deployments/{name}/…`), mapped to a model by the
    /// `azure_openai` config; the body's `model`, if any, is not what Azure serves.
    Deployment(String),
    /// The model the provider serves, as the path names it (Gemini, Vertex AI, Bedrock).
    Model(String),
    /// The path names a model that cannot be read (see the module docs): refuse the request.
    Unreadable,
}

/// A metered request: its API and the model its path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The API the body is read as.
    pub kind: ApiKind,
    /// The model the path names, if the family puts it there.
    pub model: PathModel,
}

/// The metered API of a request from its method and `:path` (query included: it is ignored), or `None`
/// for anything that is not a metered LLM call (only `POST` is).
pub fn route(method: Option<&str>, path: Option<&str>) -> Option<Route> {
    if method != Some("POST") {
        return None;
    }
    let path = path.unwrap_or_default();
    let path = path.split(['?', '#']).next().unwrap_or(path);
    if let Some(r) = plain(path) {
        return r;
    }
    by_segments(path)
}

/// The common path, read without an allocation: lower case, no `;` parameters, no `:` verb or
/// percent-encoding, no Azure deployment, no Bedrock verb. `None`: not such a path
/// ([`by_segments`] reads it); otherwise what [`by_segments`] gives for it.
fn plain(path: &str) -> Option<Option<Route>> {
    let trimmed = path.trim_end_matches('/');
    if trimmed
        .bytes()
        .any(|b| matches!(b, b';' | b':' | b'%' | b'A'..=b'Z'))
        || trimmed.contains("/deployments")
    {
        return None;
    }
    let last = trimmed.rsplit('/').next().unwrap_or_default();
    if matches!(
        last,
        "converse" | "converse-stream" | "invoke" | "invoke-with-response-stream"
    ) {
        return None;
    }
    Some(ApiKind::from_path(trimmed).map(|kind| Route {
        kind,
        model: PathModel::None,
    }))
}

/// Any path, by its segments.
fn by_segments(path: &str) -> Option<Route> {
    // Segments without their `;` parameters, trailing empty ones (trailing slashes) dropped.
    let mut segs: Vec<&str> = path
        .split('/')
        .map(|s| s.split(';').next().unwrap_or(s))
        .collect();
    while segs.last().is_some_and(|s| s.is_empty()) {
        segs.pop();
    }
    if let Some(r) = bedrock(&segs) {
        return r;
    }
    if let Some(r) = google(&segs) {
        return r;
    }
    let lower = segs.join("/").to_ascii_lowercase();
    let kind = ApiKind::from_path(&lower)?;
    Some(Route {
        kind,
        model: azure_deployment(&segs, kind),
    })
}

/// Bedrock: `…/model/{modelId…}/{verb}`; `Some(None)`: a Bedrock path that is not metered.
fn bedrock(segs: &[&str]) -> Option<Option<Route>> {
    let (verb, before) = segs.split_last()?;
    let kind = match verb.to_ascii_lowercase().as_str() {
        "converse" => ApiKind::BedrockConverse,
        "converse-stream" => ApiKind::BedrockConverseStream,
        "invoke" => ApiKind::BedrockInvoke,
        "invoke-with-response-stream" => ApiKind::BedrockInvokeStream,
        _ => return None,
    };
    let at = before
        .iter()
        .position(|s| s.eq_ignore_ascii_case("model"))?;
    let id = before.get(at + 1..).filter(|id| !id.is_empty())?;
    Some(Some(Route {
        kind,
        model: readable(&id.join("/")),
    }))
}

/// Gemini API and Vertex AI: a last segment `{resource}:{verb}`; `Some(None)`: such a path that is
/// not metered (token counting, embeddings, …).
fn google(segs: &[&str]) -> Option<Option<Route>> {
    let (last, before) = segs.split_last()?;
    let (resource, verb) = split_verb(last)?;
    let collection = before.last().map(|c| c.to_ascii_lowercase());
    let publisher = before
        .len()
        .checked_sub(2)
        .and_then(|i| before.get(i))
        .map(|p| p.to_ascii_lowercase());
    let kind = match verb.to_ascii_lowercase().as_str() {
        "generatecontent" => ApiKind::GeminiGenerate,
        "streamgeneratecontent" => ApiKind::GeminiStream,
        // Claude on Vertex AI: an Anthropic Messages body (`anthropic_version`, no `model`).
        "rawpredict" | "streamrawpredict"
            if collection.as_deref() == Some("models")
                && publisher.as_deref() == Some("anthropic") =>
        {
            // Vertex's token counting for Claude is `models/count-tokens:rawPredict`: it spends nothing.
            if resource.eq_ignore_ascii_case("count-tokens") {
                return Some(None);
            }
            ApiKind::AnthropicMessages
        }
        _ => return Some(None),
    };
    let model = match before.last() {
        // `tunedModels/{m}`, `endpoints/{id}`: named with their collection.
        Some(c) if !c.is_empty() && collection.as_deref() != Some("models") => {
            readable(&format!("{c}/{resource}"))
        }
        _ => readable(resource),
    };
    Some(Some(Route { kind, model }))
}

/// `{resource}:{verb}` (the `:` raw or as `%3A`): the resource (still percent-encoded) and the verb.
fn split_verb(seg: &str) -> Option<(&str, &str)> {
    let raw = seg.rfind(':').map(|i| (i, 1));
    let encoded = seg
        .to_ascii_lowercase()
        .rfind("%3a")
        .map(|i| (i, "%3a".len()));
    let (at, len) = match (raw, encoded) {
        (Some(r), Some(e)) => {
            if r.0 > e.0 {
                r
            } else {
                e
            }
        }
        (Some(r), None) => r,
        (None, Some(e)) => e,
        (None, None) => return None,
    };
    Some((seg.get(..at)?, seg.get(at + len..)?))
}

/// Azure OpenAI: the deployment of `…/openai/deployments/{name}/{metered suffix}`.
fn azure_deployment(segs: &[&str], kind: ApiKind) -> PathModel {
    let at = segs.windows(2).position(|w| {
        w.first().is_some_and(|s| s.eq_ignore_ascii_case("openai"))
            && w.get(1)
                .is_some_and(|s| s.eq_ignore_ascii_case("deployments"))
    });
    let Some(name) = at.and_then(|i| segs.get(i + 2)) else {
        return PathModel::None;
    };
    // The rest must be the metered suffix itself (`{name}/chat/completions`), not a deeper path
    // that happens to end like one.
    let rest = segs.get(at.map_or(0, |i| i + 3)..).unwrap_or_default();
    let rest = format!("/{}", rest.join("/")).to_ascii_lowercase();
    if rest.len() <= 1 || ApiKind::from_path(&rest) != Some(kind) {
        return PathModel::None;
    }
    match readable(name) {
        PathModel::Model(m) => PathModel::Deployment(m),
        other => other,
    }
}

/// A model named by the path: percent-decoded, checked (see the module docs).
fn readable(raw: &str) -> PathModel {
    match percent_decode(raw) {
        Some(m)
            if !m.is_empty()
                && m.len() <= MAX_PATH_MODEL_LEN
                && !m.chars().any(char::is_control) =>
        {
            PathModel::Model(m)
        }
        _ => PathModel::Unreadable,
    }
}

/// `%XX` escapes decoded; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_string());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hi = hex(*bytes.get(i + 1)?)?;
            let lo = hex(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn post(path: &str) -> Option<Route> {
        route(Some("POST"), Some(path))
    }

    fn model(kind: ApiKind, m: &str) -> Option<Route> {
        Some(Route {
            kind,
            model: PathModel::Model(m.to_string()),
        })
    }

    #[test]
    fn gemini_and_vertex_paths_name_the_model_and_the_verb_names_the_kind() {
        use ApiKind::*;
        for (path, want) in [
            (
                "/v1beta/models/gemini-2.5-flash:generateContent",
                model(GeminiGenerate, "gemini-2.5-flash"),
            ),
            (
                "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
                model(GeminiStream, "gemini-2.5-flash"),
            ),
            (
                "/v1/projects/p-1/locations/us-central1/publishers/google/models/gemini-2.0-flash-001:generateContent",
                model(GeminiGenerate, "gemini-2.0-flash-001"),
            ),
            (
                "/v1beta1/publishers/google/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key=k",
                model(GeminiStream, "gemini-2.5-pro"),
            ),
            (
                "/v1beta/tunedModels/my-tuned-1:generateContent",
                model(GeminiGenerate, "tunedModels/my-tuned-1"),
            ),
            (
                "/v1/projects/p/locations/l/endpoints/123456:generateContent",
                model(GeminiGenerate, "endpoints/123456"),
            ),
            // Case of the fixed parts, `;` parameters, trailing slashes, an encoded colon, a
            // fragment: none hides the call.
            (
                "/V1BETA/Models/Gemini-X:GENERATECONTENT/",
                model(GeminiGenerate, "Gemini-X"),
            ),
            (
                "/v1beta/models;a=b/gemini-x:generateContent;v=1?alt=sse#f",
                model(GeminiGenerate, "gemini-x"),
            ),
            (
                "/v1beta/models/gemini-x%3AstreamGenerateContent",
                model(GeminiStream, "gemini-x"),
            ),
            (
                "/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict",
                model(AnthropicMessages, "claude-sonnet-4@20250514"),
            ),
            (
                "/v1/projects/p/locations/l/publishers/anthropic/models/claude-3-5-haiku@20241022:rawPredict",
                model(AnthropicMessages, "claude-3-5-haiku@20241022"),
            ),
        ] {
            assert_eq!(post(path), want, "{path}");
        }
    }

    #[test]
    fn token_counting_and_other_verbs_are_not_metered() {
        for path in [
            "/v1beta/models/gemini-2.5-flash:countTokens",
            "/v1/projects/p/locations/l/publishers/google/models/gemini-2.0-flash:computeTokens",
            "/v1beta/models/text-embedding-004:embedContent",
            "/v1beta/models/text-embedding-004:batchEmbedContents",
            "/v1/projects/p/locations/l/publishers/google/models/imagen-3:predict",
            "/v1/projects/p/locations/l/publishers/anthropic/models/count-tokens:rawPredict",
            "/v1/projects/p/locations/l/publishers/meta/models/llama:rawPredict",
            "/model/anthropic.claude-v2/count-tokens",
            "/async-invoke",
            "/guardrail/g1/version/1/apply",
        ] {
            assert_eq!(post(path), None, "{path}");
        }
        assert_eq!(
            route(Some("GET"), Some("/v1beta/models/gemini:generateContent")),
            None
        );
        assert_eq!(route(None, None), None);
    }

    #[test]
    fn bedrock_paths_name_the_model_percent_decoded_arns_included() {
        use ApiKind::*;
        for (path, want) in [
            (
                "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse",
                model(BedrockConverse, "anthropic.claude-3-5-haiku-20241022-v1:0"),
            ),
            (
                "/model/us.anthropic.claude-sonnet-4-20250514-v1:0/converse-stream",
                model(
                    BedrockConverseStream,
                    "us.anthropic.claude-sonnet-4-20250514-v1:0",
                ),
            ),
            (
                "/model/amazon.titan-text-express-v1/invoke",
                model(BedrockInvoke, "amazon.titan-text-express-v1"),
            ),
            (
                "/model/meta.llama3-8b-instruct-v1%3A0/invoke-with-response-stream",
                model(BedrockInvokeStream, "meta.llama3-8b-instruct-v1:0"),
            ),
            (
                "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-3-haiku-20240307-v1%3A0/converse",
                model(
                    BedrockConverse,
                    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-haiku-20240307-v1:0",
                ),
            ),
            (
                "/model/arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-lite-v1:0/Converse/?x=1",
                model(
                    BedrockConverse,
                    "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-lite-v1:0",
                ),
            ),
            (
                "/bedrock/MODEL/m1;x=y/converse",
                model(BedrockConverse, "m1"),
            ),
        ] {
            assert_eq!(post(path), want, "{path}");
        }
    }

    #[test]
    fn the_plain_path_reading_agrees_with_the_segment_reading() {
        let paths = [
            "",
            "/",
            "/v1/chat/completions",
            "/v1/chat/completions/",
            "/v1//chat/completions//",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/messages",
            "/v1/complete",
            "/v1/threads/t1/messages",
            "/v1/models",
            "/openai/v1/chat/completions",
            "/openai/responses",
            "/openai/deployments/d1/chat/completions",
            "/openai/deployments",
            "/model/anthropic.claude-3/converse",
            "/model/x/invoke",
            "/invoke",
            "/a/converse-stream",
            "/v1beta/models/gemini-2.5-flash:generateContent",
            "/v1/chat/completions;x=1",
            "/V1/Chat/Completions",
            "/v1/chat%2Fcompletions",
            "/v1/embeddings/x",
            "/x/messages/",
            "/v1/chat/completions/extra",
            "/v1/responses/resp_1/cancel",
            "chat/completions",
        ];
        for p in paths {
            if let Some(fast) = plain(p) {
                assert_eq!(fast, by_segments(p), "{p}");
            }
        }
        // The common paths take the plain reading.
        for p in [
            "/v1/chat/completions",
            "/v1/messages",
            "/openai/v1/embeddings/",
        ] {
            assert!(plain(p).is_some(), "{p}");
        }
    }

    #[test]
    fn azure_deployments_are_named_and_other_openai_paths_are_as_before() {
        use ApiKind::*;
        let dep = |kind, d: &str| {
            Some(Route {
                kind,
                model: PathModel::Deployment(d.to_string()),
            })
        };
        let plain = |kind| {
            Some(Route {
                kind,
                model: PathModel::None,
            })
        };
        for (path, want) in [
            (
                "/openai/deployments/Prod-4o/chat/completions?api-version=2024-10-21",
                dep(ChatCompletions, "Prod-4o"),
            ),
            ("/openai/deployments/d1/completions", dep(Completions, "d1")),
            ("/openai/deployments/e1/embeddings/", dep(Embeddings, "e1")),
            (
                "/OpenAI/Deployments/d1;v=2/Chat/Completions",
                dep(ChatCompletions, "d1"),
            ),
            (
                "/openai/deployments/d1/extensions/chat/completions",
                dep(ChatCompletions, "d1"),
            ),
            ("/openai/v1/chat/completions", plain(ChatCompletions)),
            ("/openai/responses?api-version=preview", plain(Responses)),
            ("/v1/chat/completions", plain(ChatCompletions)),
            ("/v1/messages", plain(AnthropicMessages)),
            ("/v1/threads/t/messages", None),
            ("/openai/deployments/d1/images/generations", None),
        ] {
            assert_eq!(post(path), want, "{path}");
        }
    }

    #[test]
    fn a_model_the_path_names_but_cannot_be_read_is_unreadable() {
        let long = "m".repeat(MAX_PATH_MODEL_LEN + 1);
        for path in [
            "/model/%ZZ/converse".to_string(),
            "/model/%FF%FE/converse".to_string(),
            "/model/a%0Ab/converse".to_string(),
            format!("/model/{long}/converse"),
            "/v1beta/models/:generateContent".to_string(),
            "/openai/deployments/%/chat/completions".to_string(),
        ] {
            assert_eq!(
                post(&path).map(|r| r.model),
                Some(PathModel::Unreadable),
                "{path}"
            );
        }
        let ok = "m".repeat(MAX_PATH_MODEL_LEN);
        assert_eq!(
            post(&format!("/model/{ok}/converse")).map(|r| r.model),
            Some(PathModel::Model(ok))
        );
        // `/model/converse`: no model id at all is no Bedrock call.
        assert_eq!(post("/model/converse"), None);
    }

    #[test]
    fn odd_paths_never_panic() {
        let pieces = [
            "/",
            "model",
            "models",
            ":",
            "%3a",
            "%",
            "%3",
            "converse",
            "invoke",
            ";",
            "?",
            "#",
            "openai",
            "deployments",
            "x",
            "generateContent",
            "é",
            "",
        ];
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            let mut p = String::new();
            for _ in 0..(s % 9) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                p.push_str(pieces[(s % pieces.len() as u64) as usize]);
            }
            let _ = post(&p);
        }
    }
}
