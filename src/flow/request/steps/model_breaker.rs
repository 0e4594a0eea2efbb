//! Reading step: the model's breaker (`breaker.keys.model`). While the set of open breakers does not
//! name the model this is one shared-data read; otherwise its breaker and its fallbacks are read the
//! exact way: an open one is skipped for its fallback (the body's `model` is rewritten by the edits
//! step), and when every one is open the request is refused (503, Anthropic 529). The admission itself
//! is taken after the buckets admitted (the breakers step).

use crate::breaker::failover::{self, Choice};
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
    // The set is read again rather than kept from the headers phase: keeping it would need the time
    // of that read, and asking the host for the time costs about what this read costs.
    let v = breakers::view(cx);
    let choice = if v.may_be_open("model", &d.model) {
        let next = |m: &str| b.model_fallback(m).map(|t| (t.to_string(), None));
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
