//! Reading step: what the request costs, estimated from its body ([`crate::estimate`]): the prompt and
//! the output reserved for it, and the model it is charged as — the model its path names (Azure
//! deployments, Gemini, Vertex AI, Bedrock), else the body's `model`, else the configured
//! `default_model` of its route; with none, the request is refused (400 `model_required`): it would pass
//! every model-scoped limit unmetered. `model_header` never decides the model (it only lets the headers
//! phase refuse early). A body that is not a request to its API is refused (400) or charged a fixed
//! cost (`invalid_body`); a Responses `background: true` is refused under `background_responses:
//! "refuse"` (403: its usage could not be charged).

use crate::config::InvalidBody;
use crate::estimate;
use crate::flow::cx::Cx;
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::step::Draft;

/// Estimates the body into `d`.
pub(in crate::flow) fn read(cx: &mut Cx, d: &mut Draft) -> Result<(), Box<Denial>> {
    let (cfg, host) = (cx.cfg, cx.host);
    let path_model = d.meta.path_model.as_deref();
    // The route's default model is looked up (a property read) only for a body without a model.
    let default = std::cell::OnceCell::new();
    let default_model =
        || -> Option<String> { default.get_or_init(|| default_model(cfg, host)).clone() };
    let limits = |model: Option<&str>| match model {
        Some(m) => cfg.output_limits(Some(m)),
        None => cfg.output_limits(default_model().as_deref()),
    };
    let est = match estimate::estimate_with_model(d.kind, d.body, path_model, &limits) {
        Ok(e) => Some(e),
        Err(e) => match cfg.invalid_body {
            InvalidBody::Reject => {
                return Err(Denial::new(
                    Reason::InvalidBody,
                    answers::invalid_body(d.kind.as_str(), &e.to_string()),
                ));
            }
            InvalidBody::Charge(_) => {
                cx.inc(Metric::RequestsInvalidBodyCharged);
                None
            }
        },
    };
    if cfg.refuse_background && est.as_ref().is_some_and(|e| e.background) {
        d.model = est
            .as_ref()
            .and_then(|e| e.model.clone())
            .unwrap_or_default();
        return Err(Denial::new(
            Reason::BackgroundNotMetered,
            answers::background_not_metered(),
        ));
    }
    d.meta.background = est.as_ref().is_some_and(|e| e.background);
    (d.prompt, d.output, d.cost) = match (&est, cfg.invalid_body) {
        (Some(e), _) => (e.prompt_tokens, e.output_tokens, e.total()),
        (None, InvalidBody::Charge(t)) => (t, 0, t),
        (None, InvalidBody::Reject) => (0, 0, 0),
    };
    d.choices = est.as_ref().map_or(1, |e| e.output_choices);
    let body_model = est.as_ref().and_then(|e| e.model.as_deref()).map(|m| {
        if d.meta.azure_v1 {
            cfg.azure_openai.body_model(m)
        } else {
            m
        }
    });
    let model = path_model
        .map(str::to_string)
        .or_else(|| body_model.map(str::to_string))
        .or_else(default_model);
    d.est = est;
    match model {
        Some(m) if !m.is_empty() => {
            d.model = m;
            Ok(())
        }
        // A body that could not be read names no model that can be trusted (charged under
        // `invalid_body`, it would pass every model-scoped limit).
        _ if d.est.is_none() => Err(Denial::new(
            Reason::ModelRequired,
            answers::model_required_invalid_body(),
        )),
        _ => Err(Denial::new(
            Reason::ModelRequired,
            answers::model_required(),
        )),
    }
}

/// The configured default model of this request's Envoy route (`default_model`).
fn default_model(
    cfg: &crate::config::Config,
    host: &dyn crate::flow::effect::Host,
) -> Option<String> {
    let dm = &cfg.default_model;
    if !dm.is_set() {
        return None;
    }
    let route = dm
        .by_route()
        .then(|| host.property(&["xds", "route_name"]))
        .flatten()
        .and_then(|v| String::from_utf8(v).ok());
    dm.for_route(route.as_deref()).map(str::to_string)
}
