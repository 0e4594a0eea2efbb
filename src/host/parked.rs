//! Requests the root context continues: a request whose reservation waits in this VM's batch
//! (`flow::vm::batch`) gets its answer when the batch's call answers — at the root — and its admission
//! must go on in its own context.
//!
//! Envoy already works this way for a request's own callout: every callout belongs to the root
//! context, and the SDK delivers its answer to the request after `proxy_set_effective_context`. Here
//! the adapter does the same by hand. Each HTTP context keeps its request in an `Rc<RefCell<Stream>>`;
//! while the request waits on the root it is also listed in [`Vm::parked`](super::Vm::parked). For each
//! context the flow lists as ready (`Batcher::ready`), the root makes it the effective context, runs the
//! request's `on_callout_reply` (the quota step reads its own entry's answer from the VM) and applies
//! the effects as that request's own callback would: a local reply, a body rewrite, a resume, the audit
//! record all go to that stream. A callout the request dispatches from there is filed under the root by
//! the SDK; its token is kept in [`Vm::request_callouts`](super::Vm::request_callouts) and its answer
//! continues the request here too. A context that went (its `Http` dropped, or Envoy no longer knows
//! it) is skipped and what was kept for it dropped.

use super::abi;
use super::http::apply_fx;
use super::{EnvoyHost, VM};
use crate::config::Config;
use crate::flow::apply::From;
use crate::flow::{CalloutReply, Cx, Next};
use std::rc::Rc;

/// Continues every request the flow lists as ready.
pub fn continue_ready(cfg: &Rc<Config>) {
    loop {
        let next = VM.with(|vm| {
            let mut vm = vm.borrow_mut();
            let ready = &mut vm.worker.batch.ready;
            (!ready.is_empty()).then(|| ready.remove(0))
        });
        let Some(id) = next else {
            return;
        };
        // Its answer is in the VM: the reply given to the step is empty.
        continue_one(cfg, id, CalloutReply::answer(0, Vec::new()));
    }
}

/// The answer of a callout request `id` dispatched while the root continued it.
pub fn callout_answered(cfg: &Rc<Config>, token: u32, reply: CalloutReply) -> bool {
    let Some(id) = VM.with(|vm| vm.borrow_mut().request_callouts.remove(&token)) else {
        return false;
    };
    continue_one(cfg, id, reply);
    true
}

/// Runs request `id`'s `on_callout_reply` in its own context.
fn continue_one(cfg: &Rc<Config>, id: u32, reply: CalloutReply) {
    let Some(stream) = VM.with(|vm| vm.borrow_mut().parked.remove(&id)) else {
        VM.with(|vm| vm.borrow_mut().worker.batch.discard(id));
        return;
    };
    if abi::set_effective_context(id).is_err() {
        // Envoy no longer knows the context: the request went.
        VM.with(|vm| vm.borrow_mut().worker.batch.discard(id));
        return;
    }
    let Ok(mut st) = stream.try_borrow_mut() else {
        return;
    };
    let fx = VM.with(|vm| {
        let mut vm = vm.borrow_mut();
        let vm = &mut *vm;
        let mut cx = Cx {
            cfg,
            host: &EnvoyHost::new(),
            worker: &mut vm.worker,
            fx: &mut vm.fx,
        };
        st.req.on_callout_reply(&mut cx, reply);
        std::mem::take(&mut vm.fx)
    });
    apply_fx(cfg, &mut st, 0, Some(id), From::Callout, Next::Pause, fx);
    // Still admitting: waiting in the batch again (a next reservation), or for a callout the SDK filed
    // under the root.
    if st.req.phase() == "admitting" {
        VM.with(|vm| {
            vm.borrow_mut().parked.insert(id, Rc::clone(&stream));
        });
    }
}
