//! [`SharedStore`] over Envoy's shared data.

use super::abi;
use crate::store::{SharedStore, StoreError};

/// Envoy's shared data for this `vm_id`.
pub struct HostStore;

impl SharedStore for HostStore {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
        abi::get_shared(key).map_err(|_| StoreError::Host)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        abi::set_shared(key, value, cas).map_err(|s| {
            if s == abi::CAS_MISMATCH {
                StoreError::CasMismatch
            } else {
                StoreError::Host
            }
        })
    }
}
