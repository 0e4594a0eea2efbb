//! Reading step: what the request costs, estimated from its body ([`crate::estimate`]): the prompt and
//! the output reserved for it, the model it names (or `model_header`'s). A body that is not a request
//! to its API is refused (400) or charged a fixed cost (`invalid_body`); a Responses `background: true`
//! is refused under `background_responses: "refuse"` (403: its usage could not be charged).

use crate::config::InvalidBody;
use crate::estimate;
use crate::flow::cx::Cx;
use crate::flow::metric::Metric;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::step::Draft;

/// Estimates the body into `d`.
pub(in crate::flow) fn read(cx: &mut Cx, d: &mut Draft) -> Result<(), Box<Denial>> {
    let cfg = cx.cfg;
    let hint = d.meta.model_hint.as_deref();
    let est = match estimate::estimate(d.kind, d.body, &|model| cfg.output_limits(model.or(hint))) {
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
    d.model = est
        .as_ref()
        .and_then(|e| e.model.clone())
        .or_else(|| d.meta.model_hint.clone())
        .unwrap_or_default();
    d.est = est;
    Ok(())
}
