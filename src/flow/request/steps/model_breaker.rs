//! Reading step: the model's breaker (`breaker.keys.model`). While the set of open breakers does not
//! name the model this is one shared-data read; otherwise its breaker and its fallbacks are read the
//! exact way: an open one is skipped for its fallback (the body's `model` is rewritten by the edits
//! step), and when every one is open the request is refused (503, Anthropic 529). The admission itself
//! is taken after the buckets admitted (the breakers step).
//!
//! A model the body does not name cannot fall back: the one the path names (an Azure deployment, a
//! Gemini, Vertex AI or Bedrock model id — the provider serves the path's, whatever the body says) or,
//! on Azure's v1 paths, a deployment the body names (a model name written there is no deployment).
//! Its breaker alone decides: while it is open the request is refused (503 `circuit_open`, in the
//! family's shape, with the breaker's retry time), and its fallbacks are never taken — the Envoy route
//! or the client picks another deployment or model.

use crate::breaker::failover::{self, Choice};
use crate::config::Config;
use crate::flow::cx::Cx;
use crate::flow::request::answers;
use crate::flow::request::denial::{Denial, Reason};
use crate::flow::request::step::Draft;
use crate::flow::vm::breakers;

/// Checks the model breaker of `d.model`.
pub(in crate::flow) fn check(cx: &mut Cx, d: &mut Draft) -> Result<(), Box<Denial>> {
    let Some(b) = cx
        .cfg
        .breaker
        .as_ref()
        .filter(|b| b.keys.model && !d.model.is_empty())
    else {
        return Ok(());
    };
    // The headers phase's read of the set, while it is fresh (the body phase reads the time for its
    // buckets anyway); read again after a slow upload.
    let v = match d.meta.open_set.take() {
        Some((v, at)) if breakers::fresh(cx, at) => v,
        _ => breakers::view(cx),
    };
    let choice = if v.may_be_open("model", &d.model) {
        let fixed = body_cannot_name_model(cx.cfg, d);
        let next = |m: &str| {
            b.model_fallback(m)
                .filter(|_| !fixed)
                .map(|t| (t.to_string(), None))
        };
        let (now, retries) = (cx.now(), cx.cfg.cas_max_retries);
        failover::peek_chain(cx.store(), b, &v, "model", &d.model, &next, now, retries)
    } else {
        Ok(Choice {
            target: d.model.clone(),
            from: None,
            route: None,
            closed: true,
        })
    };
    match choice {
        Ok(Choice {
            target,
            from: Some(from),
            closed,
            ..
        }) => {
            d.model_closed = closed.then(|| target.clone());
            d.edits.set_model = Some(target.clone());
            d.fallbacks.push(format!("{from} -> {target}"));
            Ok(())
        }
        Ok(choice) => {
            d.model_closed = choice.closed.then_some(choice.target);
            Ok(())
        }
        Err(reset) => Err(Denial::new(
            Reason::CircuitOpen,
            answers::circuit_open("model", &d.model, reset),
        )),
    }
}

/// The model is not the body's to change: the path names it, or (Azure v1) the body names a
/// deployment `azure_openai.deployments` lists.
fn body_cannot_name_model(cfg: &Config, d: &Draft) -> bool {
    d.meta.path_model.is_some()
        || (d.meta.azure_v1
            && d.est
                .as_ref()
                .and_then(|e| e.model.as_deref())
                .is_some_and(|m| cfg.azure_openai.lists(m)))
}
