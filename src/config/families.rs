//! `azure_openai`: which model each Azure OpenAI deployment serves.
//!
//! ```json
//! "azure_openai": {"deployments": {"prod-4o": "gpt-4o", "mini": "gpt-4o-mini"},
//!                  "unknown_deployment": "refuse"}
//! ```
//! Azure OpenAI puts the deployment in the path (`/openai/deployments/{deployment}/chat/completions`)
//! and its REST bodies carry no `model`: the filter charges the request as the model the deployment
//! serves, so that model-scoped rules, limits, quotas' weights and output caps apply to it.
//!
//! * A deployment listed in `deployments` is its model (names compared without ASCII case).
//! * A deployment not listed, with `unknown_deployment: "refuse"` (the default once `deployments` is
//!   given): 400 `unknown_deployment` in OpenAI's shape, before anything is charged or forwarded.
//!   With `"as_model"`: the deployment name is taken as the model name (rules can name deployments).
//! * Without the `azure_openai` section every deployment name is taken as the model name (`"as_model"`
//!   with an empty map).
//!
//! On Azure's v1 API (`/openai/v1/chat/completions`, `/openai/responses`) the body's `model` is a
//! deployment name: [`AzureOpenAi::body_model`] maps it when it is a listed deployment, and leaves any
//! other model as it is (those paths also serve other providers' OpenAI-compatible APIs).

use super::shape::UniqueMap;
use super::{err, ConfigError};
use serde::Deserialize;

/// Most entries in `azure_openai.deployments`.
pub const MAX_DEPLOYMENTS: usize = 1024;
/// Longest deployment name Azure accepts.
pub const MAX_DEPLOYMENT_LEN: usize = 64;
/// Longest model name a deployment maps to.
pub const MAX_MODEL_LEN: usize = 256;

/// `azure_openai` as given.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object with deployments and unknown_deployment"
)]
pub(super) struct RawAzure {
    deployments: Option<UniqueMap<String>>,
    unknown_deployment: Option<String>,
}

/// What happens to a deployment that `deployments` does not list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownDeployment {
    /// Refused with 400 `unknown_deployment`.
    Refuse,
    /// Charged as a model named like the deployment.
    AsModel,
}

/// `azure_openai`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct AzureOpenAi {
    /// Deployment name in ASCII lower case → the model it serves, sorted by name.
    pub deployments: Vec<(String, String)>,
    /// A deployment not listed.
    pub unknown: UnknownDeployment,
}

impl Default for AzureOpenAi {
    /// No section: every deployment name is its own model.
    fn default() -> Self {
        AzureOpenAi {
            deployments: Vec::new(),
            unknown: UnknownDeployment::AsModel,
        }
    }
}

impl AzureOpenAi {
    /// The model a deployment serves: its mapped model, its own name (`as_model`), or `None`: refuse it
    /// (400 `unknown_deployment`).
    pub fn model_for(&self, deployment: &str) -> Option<String> {
        match self.lookup(deployment) {
            Some(model) => Some(model.to_string()),
            None if self.unknown == UnknownDeployment::AsModel => Some(deployment.to_string()),
            None => None,
        }
    }

    /// The model a body names on Azure's v1 paths, where it is a deployment name: its mapped model if
    /// it is a listed deployment, else the name as it is.
    pub fn body_model<'m>(&'m self, model: &'m str) -> &'m str {
        self.lookup(model).unwrap_or(model)
    }

    /// `deployments` lists this name (compared without ASCII case).
    pub fn lists(&self, deployment: &str) -> bool {
        self.lookup(deployment).is_some()
    }

    fn lookup(&self, deployment: &str) -> Option<&str> {
        let key = deployment.to_ascii_lowercase();
        self.deployments
            .binary_search_by(|(d, _)| d.as_str().cmp(key.as_str()))
            .ok()
            .and_then(|i| self.deployments.get(i))
            .map(|(_, m)| m.as_str())
    }
}

/// Validates `azure_openai`.
pub(super) fn azure(raw: Option<RawAzure>) -> Result<AzureOpenAi, ConfigError> {
    let Some(raw) = raw else {
        return Ok(AzureOpenAi::default());
    };
    let unknown = super::top::either(
        "azure_openai.unknown_deployment",
        raw.unknown_deployment.as_deref(),
        ("refuse", UnknownDeployment::Refuse),
        ("as_model", UnknownDeployment::AsModel),
    )?;
    let given = raw.deployments.unwrap_or_default();
    let mut deployments: Vec<(String, String)> = Vec::new();
    for (name, model) in given {
        let field = format!("azure_openai.deployments.{name}");
        if name.is_empty()
            || name.len() > MAX_DEPLOYMENT_LEN
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(err(
                field,
                format!("a deployment name is 1 to {MAX_DEPLOYMENT_LEN} letters, digits, '-', '_' or '.'"),
            ));
        }
        if model.is_empty() || model.len() > MAX_MODEL_LEN || model.chars().any(char::is_control) {
            return Err(err(
                field,
                format!("must name a model: 1 to {MAX_MODEL_LEN} bytes without control characters"),
            ));
        }
        if model.contains('*') {
            return Err(err(
                field,
                format!("'{model}' must be an exact model name (a deployment serves one model)"),
            ));
        }
        let key = name.to_ascii_lowercase();
        if let Some((other, _)) = deployments.iter().find(|(d, _)| *d == key) {
            return Err(err(
                field,
                format!("'{name}' is '{other}' again: deployment names are compared without case"),
            ));
        }
        deployments.push((key, model));
    }
    if deployments.len() > MAX_DEPLOYMENTS {
        return Err(err(
            "azure_openai.deployments",
            format!(
                "must hold at most {MAX_DEPLOYMENTS} deployments, got {}",
                deployments.len()
            ),
        ));
    }
    deployments.sort();
    Ok(AzureOpenAi {
        deployments,
        unknown,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::testing::{parse_str, refusal, with, MIN};
    use super::*;

    #[test]
    fn deployments_map_to_models_without_case_and_unknown_ones_are_refused_by_default() {
        let c = parse_str(&with(
            "",
            r#","azure_openai": {"deployments": {"Prod-4o": "gpt-4o", "mini": "gpt-4o-mini"}}"#,
        ))
        .unwrap();
        let a = &c.azure_openai;
        assert_eq!(a.unknown, UnknownDeployment::Refuse);
        assert_eq!(a.model_for("prod-4o").as_deref(), Some("gpt-4o"));
        assert_eq!(a.model_for("PROD-4O").as_deref(), Some("gpt-4o"));
        assert_eq!(a.model_for("mini").as_deref(), Some("gpt-4o-mini"));
        assert_eq!(a.model_for("other"), None);
        assert_eq!(a.body_model("Mini"), "gpt-4o-mini");
        assert_eq!(a.body_model("gpt-4.1"), "gpt-4.1");
    }

    #[test]
    fn without_the_section_or_with_as_model_a_deployment_is_its_own_model() {
        let c = parse_str(MIN).unwrap();
        assert_eq!(c.azure_openai, AzureOpenAi::default());
        assert_eq!(c.azure_openai.model_for("dep-1").as_deref(), Some("dep-1"));
        let c = parse_str(&with(
            "",
            r#","azure_openai": {"deployments": {"a": "gpt-4o"}, "unknown_deployment": "as_model"}"#,
        ))
        .unwrap();
        assert_eq!(c.azure_openai.model_for("a").as_deref(), Some("gpt-4o"));
        assert_eq!(c.azure_openai.model_for("b").as_deref(), Some("b"));
    }

    #[test]
    fn bad_maps_are_refused_with_one_line() {
        for (cfg, want) in [
            (
                r#"{"unknown_deployment": "charge"}"#,
                "azure_openai.unknown_deployment: must be \"refuse\" or \"as_model\", got \"charge\"",
            ),
            (
                r#"{"deployments": {"a b": "gpt-4o"}}"#,
                "azure_openai.deployments.a b: a deployment name is 1 to 64 letters",
            ),
            (
                r#"{"deployments": {"": "gpt-4o"}}"#,
                "azure_openai.deployments.: a deployment name is 1 to 64",
            ),
            (
                r#"{"deployments": {"a": ""}}"#,
                "azure_openai.deployments.a: must name a model",
            ),
            (
                r#"{"deployments": {"a": "gpt-*"}}"#,
                "azure_openai.deployments.a: 'gpt-*' must be an exact model name",
            ),
            (
                r#"{"deployments": {"a": "m", "A": "n"}}"#,
                "deployment names are compared without case",
            ),
            (
                r#"{"deployments": {"a": "m", "a": "n"}}"#,
                "azure_openai.deployments.a: is given more than once",
            ),
            (r#"{"deployments": {"a": 5}}"#, "azure_openai.deployments.a"),
            (r#"{"deployment": {}}"#, "unknown field `deployment`"),
        ] {
            let msg = refusal(&with("", &format!(r#","azure_openai": {cfg}"#)));
            assert!(msg.contains(want), "{cfg}: {msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        let many: Vec<String> = (0..=MAX_DEPLOYMENTS)
            .map(|i| format!(r#""d{i}":"m""#))
            .collect();
        let msg = refusal(&with(
            "",
            &format!(
                r#","azure_openai": {{"deployments": {{{}}}}}"#,
                many.join(",")
            ),
        ));
        assert!(msg.contains("at most 1024 deployments"), "{msg}");
    }
}
