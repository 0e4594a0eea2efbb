//! Envoy counters for every [`Metric`]: defined once per VM, in [`Metric::ALL`] order.

use super::abi::{self, MetricType};
use crate::flow::Metric;
use std::cell::RefCell;

/// Id used when a metric could not be defined.
pub const UNDEFINED: u32 = u32::MAX;

thread_local! {
    static IDS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Defines every counter (idempotent across VMs: Envoy dedups by name).
pub fn init() {
    let ids: Vec<u32> = Metric::ALL
        .iter()
        .map(|m| abi::define_metric(MetricType::Counter, m.name()).unwrap_or(UNDEFINED))
        .collect();
    IDS.with(|i| *i.borrow_mut() = ids);
}

/// Adds `by` to a counter.
pub fn add(m: Metric, by: u64) {
    let id = IDS.with(|i| i.borrow().get(m as usize).copied().unwrap_or(UNDEFINED));
    if id != UNDEFINED {
        abi::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
    }
}
