//! Metrics named at run time, defined lazily and cached per VM: gauges (breaker state per key,
//! `tokengate_breaker_state.<scope>=<name>`; a fair limit's members and share,
//! `tokengate_fair_active_members.<limit>`) and counters (a fair limit's refusals,
//! `tokengate_fair_refused_over_share.<limit>`). The set of names is bounded by the configuration
//! (`breaker.max_keys`, the limits).

use super::abi::{self, MetricType};
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    static IDS: RefCell<HashMap<String, u32, crate::store::hash::FnvBuild>> =
        RefCell::new(HashMap::default());
}

/// The id of metric `name` of type `kind`, defined at its first use (`None`: the host refused it).
fn id(kind: MetricType, name: &str) -> Option<u32> {
    IDS.with(|ids| {
        let mut ids = ids.borrow_mut();
        if let Some(id) = ids.get(name) {
            return Some(*id);
        }
        let id = abi::define_metric(kind, name).ok()?;
        ids.insert(name.to_string(), id);
        Some(id)
    })
}

/// Sets gauge `name` to `value`.
pub fn set(name: &str, value: u64) {
    if let Some(id) = id(MetricType::Gauge, name) {
        abi::record_metric(id, value);
    }
}

/// Adds `by` to counter `name` (a name is a counter or a gauge, never both: the callers' names differ).
pub fn add(name: &str, by: u64) {
    if let Some(id) = id(MetricType::Counter, name) {
        abi::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
    }
}
