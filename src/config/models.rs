//! `default_output` and `models`: how many output tokens a request reserves when it sets no `max_tokens`,
//! and the most it may ask for, per model pattern:
//! `"models": {"gpt-4.1": {"default_max_tokens": 4096, "max_tokens_cap": 32768}}`.

use super::rules::{model_pattern, ModelMatch};
use super::shape::UniqueMap;
use super::{err, ConfigError};
use crate::estimate::OutputLimits;
use serde::Deserialize;

/// Default output reservation when a request sets no `max_tokens` and its model has no entry.
pub const DEFAULT_OUTPUT: OutputLimits = OutputLimits {
    default_tokens: 1024,
    cap_tokens: 32768,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a JSON object")]
pub(super) struct RawOutput {
    default_max_tokens: Option<u64>,
    max_tokens_cap: Option<u64>,
}

fn output(field: &str, raw: &RawOutput, base: OutputLimits) -> Result<OutputLimits, ConfigError> {
    let cap = raw.max_tokens_cap.unwrap_or(base.cap_tokens);
    let default = raw
        .default_max_tokens
        .unwrap_or(base.default_tokens.min(cap));
    if cap == 0 {
        return Err(err(format!("{field}.max_tokens_cap"), "must be >= 1"));
    }
    if default > cap {
        return Err(err(
            format!("{field}.default_max_tokens"),
            format!("{default} is larger than max_tokens_cap {cap}"),
        ));
    }
    Ok(OutputLimits {
        default_tokens: default,
        cap_tokens: cap,
    })
}

/// The validated `default_output` and `models` entries, most specific pattern first.
pub(super) fn models(
    default_output: Option<&RawOutput>,
    raw: &UniqueMap<RawOutput>,
) -> Result<(OutputLimits, Vec<(ModelMatch, OutputLimits)>), ConfigError> {
    let default_output = match default_output {
        None => DEFAULT_OUTPUT,
        Some(o) => output("default_output", o, DEFAULT_OUTPUT)?,
    };
    let mut models = Vec::new();
    for (name, o) in raw {
        if name.is_empty() {
            return Err(err("models", "model name must not be empty"));
        }
        let pattern = model_pattern(&format!("models.{name}"), name)?;
        models.push((
            pattern,
            output(&format!("models.{name}"), o, default_output)?,
        ));
    }
    // Exact names before prefixes before "*", so lookups find the most specific entry first.
    models.sort_by_key(|(m, _)| match m {
        ModelMatch::Exact(_) => 0,
        ModelMatch::Prefix(p) => 1 + usize::MAX / 2 - p.len().min(usize::MAX / 4),
        ModelMatch::Any => usize::MAX,
    });

    Ok((default_output, models))
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn model_output_limits_prefer_exact_then_prefix() {
        let c = parse_str(
            r#"{"models":{"gpt-4*":{"default_max_tokens":100},"gpt-4.1":{"default_max_tokens":200}},
                "rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap();
        assert_eq!(c.output_limits(Some("gpt-4.1")).default_tokens, 200);
        assert_eq!(c.output_limits(Some("gpt-4o")).default_tokens, 100);
        assert_eq!(c.output_limits(Some("x")).default_tokens, 1024);
        assert_eq!(c.output_limits(None).default_tokens, 1024);
    }

    #[test]
    fn default_larger_than_cap_is_refused() {
        let e = parse_str(
            r#"{"models":{"m":{"default_max_tokens":100,"max_tokens_cap":10}},"rules":[{"tokens_per_second":1,"burst":1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "models.m.default_max_tokens");
    }
}

/// `default_model`: what a request whose body names no model is charged as — one model for every route
/// (`"gpt-4.1-mini"`), or one per Envoy route name (`{"local-llama": "llama-3.1-8b", "*": "gpt-4.1-mini"}`,
/// `*` for the others). Without one, such a request is refused (400 `model_required`): it would pass
/// every model-scoped limit unmetered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DefaultModel {
    /// Per Envoy route name (`xds.route_name`).
    pub routes: Vec<(String, String)>,
    /// For every other route (`*`, or the plain string).
    pub any: Option<String>,
}

impl DefaultModel {
    /// True when some route has a default (the route's name is then read for a body without a model).
    pub fn is_set(&self) -> bool {
        self.any.is_some() || !self.routes.is_empty()
    }

    /// True when the route's name decides it.
    pub fn by_route(&self) -> bool {
        !self.routes.is_empty()
    }

    /// The default for the route named `route` (`None`: the route has no name, or none is known).
    pub fn for_route(&self, route: Option<&str>) -> Option<&str> {
        route
            .and_then(|r| self.routes.iter().find(|(n, _)| n == r))
            .map(|(_, m)| m.as_str())
            .or(self.any.as_deref())
    }
}

/// A string, or an object of strings.
pub(super) enum RawDefaultModel {
    One(String),
    PerRoute(UniqueMap<String>),
}

impl<'de> Deserialize<'de> for RawDefaultModel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawDefaultModel;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a model name or an object {\"<route name>\": \"<model>\", \"*\": …}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(RawDefaultModel::One(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                UniqueMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawDefaultModel::PerRoute)
            }
        }
        d.deserialize_any(V)
    }
}

/// Validates `default_model`.
pub(super) fn default_model(raw: Option<RawDefaultModel>) -> Result<DefaultModel, ConfigError> {
    let check = |field: &str, m: &str| {
        if m.is_empty() {
            return Err(err(field, "must name a model"));
        }
        super::fields::exact_model(field, m)
    };
    match raw {
        None => Ok(DefaultModel::default()),
        Some(RawDefaultModel::One(m)) => {
            check("default_model", &m)?;
            Ok(DefaultModel {
                routes: Vec::new(),
                any: Some(m),
            })
        }
        Some(RawDefaultModel::PerRoute(map)) => {
            let mut out = DefaultModel::default();
            for (route, m) in map {
                let field = format!("default_model.{route}");
                check(&field, &m)?;
                if route.is_empty() {
                    return Err(err(field, "a route name must not be empty"));
                }
                if route == "*" {
                    out.any = Some(m);
                } else {
                    out.routes.push((route, m));
                }
            }
            Ok(out)
        }
    }
}
