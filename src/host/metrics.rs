//! Envoy stats defined by the filter. In `/stats` they show as `wasmcustom.<name>`, in
//! `/stats/prometheus` as `<name>`.

use super::abi::{self, MetricType};
use std::cell::Cell;

macro_rules! counters {
    ($($field:ident),* $(,)?) => {
        /// Metric ids of this VM (`UNDEFINED` when the host refused the definition).
        #[derive(Clone, Copy)]
        pub struct Metrics { $(
            #[doc = concat!("`tokengate_", stringify!($field), "`")]
            pub $field: u32,
        )* }
        impl Default for Metrics {
            fn default() -> Self { Metrics { $($field: UNDEFINED,)* } }
        }
        impl Metrics {
            /// Defines every counter (idempotent across VMs: Envoy dedups by name).
            pub fn define() -> Self {
                Metrics { $(
                    $field: abi::define_metric(MetricType::Counter, concat!("tokengate_", stringify!($field))).unwrap_or(UNDEFINED),
                )* }
            }
        }
    };
}

counters!(
    requests_admitted,
    requests_limited_tokens,
    requests_limited_requests,
    requests_shaped,
    requests_rejected_invalid_body,
    requests_rejected_too_large,
    requests_rejected_cost_exceeds_burst,
    requests_rejected_no_tenant,
    requests_passthrough,
    requests_invalid_body_charged,
    tokens_estimated,
    tokens_credited,
    tokens_debited,
    cas_exhausted,
    state_corrupt,
    store_errors,
    tenant_overflow,
    breaker_opened,
    breaker_half_opened,
    breaker_closed,
    breaker_short_circuited,
    breaker_probes,
    breaker_fallbacks,
    quota_reserved,
    quota_reserved_tokens,
    quota_rejected,
    quota_rejected_cached,
    quota_duplicates,
    quota_clamped,
    quota_settled,
    quota_settle_duplicates,
    quota_settle_retries,
    quota_settle_dropped,
    quota_refunded_tokens,
    quota_extra_charged_tokens,
    quota_shim_errors,
    quota_fail_open,
    quota_fail_closed,
    quota_reconciled,
    global_charged,
    global_rejected_cached,
    global_shim_errors,
    global_fallback_local,
    global_fail_open,
    global_fail_closed,
    global_tokens_credited,
    global_tokens_debited,
    global_credits_dropped,
);

/// Id used when a metric could not be defined (Envoy numbers counters from 0).
pub const UNDEFINED: u32 = u32::MAX;

thread_local! {
    static METRICS: Cell<Metrics> = Cell::new(Metrics::default());
}

/// Defines the metrics once per VM.
pub fn init() {
    METRICS.with(|m| m.set(Metrics::define()));
}

/// This VM's metric ids.
pub fn get() -> Metrics {
    METRICS.with(|m| m.get())
}

/// Adds `by` to a counter.
pub fn add(id: u32, by: u64) {
    if id != UNDEFINED {
        abi::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
    }
}

/// Adds one to a counter.
pub fn inc(id: u32) {
    add(id, 1);
}
