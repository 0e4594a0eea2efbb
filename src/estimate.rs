//! STUB (being written): token-cost estimation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ApiKind { ChatCompletions, Completions, Embeddings, Responses, AnthropicMessages }
impl ApiKind {
    pub fn from_path(path: &str) -> Option<ApiKind> {
        let p = path.split('?').next().unwrap_or("");
        if p.ends_with("/chat/completions") { Some(ApiKind::ChatCompletions) }
        else if p.ends_with("/completions") { Some(ApiKind::Completions) }
        else if p.ends_with("/embeddings") { Some(ApiKind::Embeddings) }
        else if p.ends_with("/responses") { Some(ApiKind::Responses) }
        else if p.ends_with("/messages") { Some(ApiKind::AnthropicMessages) }
        else { None }
    }
    pub fn as_str(&self) -> &'static str { "chat" }
}
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutputLimits { pub default_tokens: u64, pub cap_tokens: u64 }
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate { pub kind: ApiKind, pub model: Option<String>, pub prompt_tokens: u64, pub output_tokens: u64, pub requested_output: Option<u64>, pub stream: bool, pub include_usage: bool }
impl Estimate { pub fn total(&self) -> u64 { self.prompt_tokens.saturating_add(self.output_tokens) } }
#[derive(Debug, Clone, PartialEq)]
pub enum EstimateError { NotJson(String), NotObject, BadField(&'static str) }
impl std::fmt::Display for EstimateError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{:?}", self) } }
pub fn estimate(kind: ApiKind, body: &[u8], limits: &dyn Fn(Option<&str>) -> OutputLimits) -> Result<Estimate, EstimateError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| EstimateError::NotJson(e.to_string()))?;
    let o = v.as_object().ok_or(EstimateError::NotObject)?;
    let model = o.get("model").and_then(|m| m.as_str()).map(str::to_string);
    let l = limits(model.as_deref());
    let req = o.get("max_tokens").and_then(|m| m.as_u64());
    let out = req.unwrap_or(l.default_tokens).min(l.cap_tokens);
    Ok(Estimate { kind, model, prompt_tokens: (body.len() as u64) / 4, output_tokens: out, requested_output: req, stream: false, include_usage: false })
}
pub fn text_tokens(text: &str) -> u64 { text.len() as u64 / 4 }
