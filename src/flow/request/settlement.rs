//! Settling one reservation: what it is charged for how its response ended
//! ([`crate::quota::accounting::settle`]), queued for the VM that sends the settlement journal — a
//! reservation replaced by the actual cost ([`SettleMode::Settle`]), or a request with no known
//! reservation (admitted while the shim was down, or whose reservation's outcome is unknown) charged it
//! ([`SettleMode::Charge`], reconciled in Redis against whatever reached it). A leased reservation is
//! settled into this Envoy's lease instead ([`crate::flow::vm::leases::settle`]).

use super::state::{Hold, QuotaReq};
use crate::flow::cx::Cx;
use crate::flow::vm::settle;
use crate::quota::accounting::{self, Ending};
use crate::quota::settlement::Job;
use crate::quota::{SettleArgs, SettleMode};

/// Gives a whole reservation back (the request was refused after it was reserved).
pub(in crate::flow) fn refund_reservation(cx: &mut Cx, qr: &mut QuotaReq) {
    queue(cx, qr, SettleMode::Settle, Ending::NotServed);
}

/// Settles a reservation Redis holds for how its response ended.
pub(in crate::flow) fn settle_reserved(cx: &mut Cx, qr: &mut QuotaReq, ending: Ending) {
    queue(cx, qr, SettleMode::Settle, ending);
}

/// Queues a reconciliation: charge what the request really cost, whatever the lost reservation did.
pub(in crate::flow) fn reconcile(cx: &mut Cx, qr: &mut QuotaReq, ending: Ending) {
    queue(cx, qr, SettleMode::Charge, ending);
}

fn queue(cx: &mut Cx, qr: &mut QuotaReq, mode: SettleMode, ending: Ending) {
    qr.hold = Hold::Settled;
    let st = accounting::settle(&qr.reserved, ending);
    let (tokens_in, tokens_out) = accounting::tokens_io(ending);
    qr.actual = Some(st.actual);
    qr.source = Some(st.source);
    let reserved = match mode {
        SettleMode::Settle => qr.reserved.total(),
        SettleMode::Charge => 0,
    };
    settle::enqueue(
        cx,
        Job {
            args: SettleArgs {
                keys: qr.args.keys(),
                mode,
                actual: st.actual,
                expire_at_unix: qr.expire_at,
                tokens_in,
                tokens_out,
            },
            reserved,
        },
    );
}
