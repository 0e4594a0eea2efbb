//! Per-key gauges (breaker state), defined lazily and cached per VM. Names:
//! `tokengate_breaker_state.<scope>=<name>` (0 closed, 1 open, 2 half-open). The set of names is bounded
//! by `breaker.max_keys`.

use super::abi::{self, MetricType};
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    static IDS: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
}

/// Sets the state gauge of a breaker key (`tg:cb:<scope>=<name>`).
pub fn set_breaker_state(key: &str, value: u64) {
    let name = format!(
        "tokengate_breaker_state.{}",
        key.strip_prefix("tg:cb:").unwrap_or(key)
    );
    let id = IDS.with(|ids| {
        let mut ids = ids.borrow_mut();
        if let Some(id) = ids.get(&name) {
            return Some(*id);
        }
        let id = abi::define_metric(MetricType::Gauge, &name).ok()?;
        ids.insert(name, id);
        Some(id)
    });
    if let Some(id) = id {
        abi::record_metric(id, value);
    }
}
