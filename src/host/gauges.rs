//! Gauges named at run time (breaker state per key, `tokengate_breaker_state.<scope>=<name>`), defined
//! lazily and cached per VM. The set of names is bounded by `breaker.max_keys`.

use super::abi::{self, MetricType};
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    static IDS: RefCell<HashMap<String, u32, crate::store::hash::FnvBuild>> =
        RefCell::new(HashMap::default());
}

/// Sets gauge `name` to `value`.
pub fn set(name: &str, value: u64) {
    let id = IDS.with(|ids| {
        let mut ids = ids.borrow_mut();
        if let Some(id) = ids.get(name) {
            return Some(*id);
        }
        let id = abi::define_metric(MetricType::Gauge, name).ok()?;
        ids.insert(name.to_string(), id);
        Some(id)
    });
    if let Some(id) = id {
        abi::record_metric(id, value);
    }
}
