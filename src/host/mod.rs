//! The host adapter: the only code that talks to Envoy (through [`abi`], and the SDK's context traits).
//!
//! It shows the pure flow ([`crate::flow`]) what Envoy shows — headers, bodies, properties, time, shared
//! data — and applies the effects ([`crate::flow::Effect`]) the flow returns. Per-VM state lives in a
//! thread-local [`Vm`]: each Envoy worker has its own VM, so it is never shared across threads;
//! cross-worker state lives only in shared data.

pub mod abi;
pub mod effects;
pub mod gauges;
pub mod http;
pub mod metrics;
pub mod root;
pub mod store;

use crate::flow::{Body, Effect, Host, Purpose, Worker};
use crate::store::SharedStore;
use std::cell::RefCell;
use std::collections::HashMap;

/// Per-VM state shared by the root context and the HTTP contexts of one worker.
#[derive(Default)]
pub struct Vm {
    /// The flow's per-VM state.
    pub worker: Worker,
    /// The effect buffer (reused: its capacity survives requests).
    pub fx: Vec<Effect>,
    /// Root callouts in flight: host token → purpose.
    pub root_callouts: HashMap<u32, Purpose, crate::hash::FnvBuild>,
}

thread_local! {
    /// This VM's state.
    pub static VM: RefCell<Vm> = RefCell::new(Vm::default());
}

/// The host as the flow sees it.
pub struct EnvoyHost;

impl Host for EnvoyHost {
    fn now_ns(&self) -> u64 {
        abi::now_ns().unwrap_or(0)
    }
    fn store(&self) -> &dyn SharedStore {
        &store::HostStore
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        abi::get_property(path).ok().flatten()
    }
    fn body(&self, which: Body, size: usize) -> Option<Vec<u8>> {
        let b = match which {
            Body::Request => abi::Buffer::RequestBody,
            Body::ResponseChunk => abi::Buffer::ResponseBody,
        };
        abi::get_buffer(b, 0, size).ok()
    }
}

impl crate::flow::Headers for abi::HeaderBlob {
    fn get(&self, name: &str) -> Option<&str> {
        self.find(name)
    }
}

/// A header map read from the host on the first lookup only (one host call for all of them, none when
/// the flow looks at no header: a data-returning host call costs about 11 k instructions).
pub struct LazyHeaders {
    map: abi::Map,
    blob: std::cell::OnceCell<abi::HeaderBlob>,
}

impl LazyHeaders {
    /// Map `map`, not read yet.
    pub fn new(map: abi::Map) -> Self {
        LazyHeaders {
            map,
            blob: std::cell::OnceCell::new(),
        }
    }
}

impl crate::flow::Headers for LazyHeaders {
    fn get(&self, name: &str) -> Option<&str> {
        self.blob
            .get_or_init(|| abi::HeaderBlob::get(self.map))
            .find(name)
    }
}
