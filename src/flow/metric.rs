//! Every counter the filter exports, as a pure enum: the flow counts with [`Metric`] values and the host
//! adapter defines one Envoy counter per variant (`tokengate_<name>`, see [`Metric::name`]).
//!
//! In `/stats` they show as `wasmcustom.tokengate_<name>`, in `/stats/prometheus` as `tokengate_<name>`.

macro_rules! metrics {
    ($($variant:ident => $name:literal,)*) => {
        /// One counter.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(missing_docs)]
        pub enum Metric { $($variant,)* }

        impl Metric {
            /// Every counter, in definition order (the host defines them in this order).
            pub const ALL: &'static [Metric] = &[$(Metric::$variant,)*];

            /// The exported name.
            pub fn name(self) -> &'static str {
                match self { $(Metric::$variant => concat!("tokengate_", $name),)* }
            }
        }
    };
}

metrics! {
    RequestsAdmitted => "requests_admitted",
    RequestsLimitedTokens => "requests_limited_tokens",
    RequestsLimitedRequests => "requests_limited_requests",
    RequestsLimitedInFlight => "requests_limited_in_flight",
    RequestsShaped => "requests_shaped",
    ShadowRefusals => "shadow_refusals",
    RequestsRejectedInvalidBody => "requests_rejected_invalid_body",
    RequestsRejectedTooLarge => "requests_rejected_too_large",
    RequestsRejectedCostExceedsBurst => "requests_rejected_cost_exceeds_burst",
    RequestsRejectedNoTenant => "requests_rejected_no_tenant",
    RequestsPassthrough => "requests_passthrough",
    RequestsRejectedUnmetered => "requests_rejected_unmetered",
    RequestsAbandoned => "requests_abandoned",
    RequestsInvalidBodyCharged => "requests_invalid_body_charged",
    RequestsOutputCapped => "requests_output_capped",
    TokensEstimated => "tokens_estimated",
    TokensCredited => "tokens_credited",
    TokensDebited => "tokens_debited",
    CasExhausted => "cas_exhausted",
    StateCorrupt => "state_corrupt",
    StoreErrors => "store_errors",
    TenantOverflow => "tenant_overflow",
    HostRefused => "host_refused",
    BreakerOpened => "breaker_opened",
    BreakerHalfOpened => "breaker_half_opened",
    BreakerClosed => "breaker_closed",
    BreakerShortCircuited => "breaker_short_circuited",
    BreakerProbes => "breaker_probes",
    BreakerFallbacks => "breaker_fallbacks",
    QuotaReserved => "quota_reserved",
    QuotaReservedTokens => "quota_reserved_tokens",
    QuotaRejected => "quota_rejected",
    QuotaRejectedCached => "quota_rejected_cached",
    QuotaClamped => "quota_clamped",
    QuotaSettled => "quota_settled",
    QuotaSettleDuplicates => "quota_settle_duplicates",
    QuotaSettleRetries => "quota_settle_retries",
    QuotaSettleDropped => "quota_settle_dropped",
    QuotaRefundedTokens => "quota_refunded_tokens",
    QuotaExtraChargedTokens => "quota_extra_charged_tokens",
    QuotaShimErrors => "quota_shim_errors",
    QuotaBatched => "quota_batched",
    QuotaBatchCalls => "quota_batch_calls",
    QuotaFailOpen => "quota_fail_open",
    QuotaFailClosed => "quota_fail_closed",
    QuotaReconciled => "quota_reconciled",
    QuotaLeased => "quota_leased",
    QuotaLeaseSyncs => "quota_lease_syncs",
    GlobalCharged => "global_charged",
    GlobalRejectedCached => "global_rejected_cached",
    GlobalShimErrors => "global_shim_errors",
    GlobalFallbackLocal => "global_fallback_local",
    GlobalFailOpen => "global_fail_open",
    GlobalFailClosed => "global_fail_closed",
    GlobalTokensCredited => "global_tokens_credited",
    GlobalTokensDebited => "global_tokens_debited",
    GlobalCreditsDropped => "global_credits_dropped",
    GlobalLeased => "global_leased",
    GlobalLeaseCalls => "global_lease_calls",
    GlobalLeaseTokens => "global_lease_tokens",
    GlobalLeaseReturnedTokens => "global_lease_returned_tokens",
    LogsSuppressed => "logs_suppressed",
    ShimClusterUnreachable => "shim_cluster_unreachable",
    ResponsesBeforeDecision => "responses_before_decision",
    FairRefusedOverShare => "fair_refused_over_share",
    FairRefusedLimitEmpty => "fair_refused_limit_empty",
    FairOverflow => "fair_overflow",
    RequestsDowngraded => "requests_downgraded",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_are_unique_and_prefixed() {
        let mut seen = std::collections::HashSet::new();
        for m in Metric::ALL {
            assert!(m.name().starts_with("tokengate_"));
            assert!(seen.insert(m.name()), "{} twice", m.name());
        }
    }
}
