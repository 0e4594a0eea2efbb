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
pub mod parked;
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
    pub root_callouts: HashMap<u32, Purpose, crate::store::hash::FnvBuild>,
    /// Requests the root continues ([`parked`]): context id → the request's state.
    pub parked: HashMap<u32, std::rc::Rc<RefCell<http::Stream>>, crate::store::hash::FnvBuild>,
    /// Callouts a request dispatched while the root continued it (the SDK files them under the root):
    /// host token → the request's context id.
    pub request_callouts: HashMap<u32, u32, crate::store::hash::FnvBuild>,
    /// This VM's own shared queue, which wakes its root ([`crate::flow::Effect::WakeRoot`]).
    pub wake_queue: Option<u32>,
}

thread_local! {
    /// This VM's state.
    pub static VM: RefCell<Vm> = RefCell::new(Vm::default());
}

thread_local! {
    /// The last host time any callback of this VM read ([`Host::recent_ns`]); 0 before the first.
    static LAST_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The host as the flow sees it, for one callback (made anew for each).
pub struct EnvoyHost {
    clock: CallbackClock<fn() -> u64>,
}

impl EnvoyHost {
    /// The host for one callback: its clock not read yet.
    pub fn new() -> Self {
        EnvoyHost {
            clock: CallbackClock::new(|| {
                let t = abi::now_ns().unwrap_or(0);
                LAST_NS.with(|l| l.set(t));
                t
            }),
        }
    }
}

impl Default for EnvoyHost {
    fn default() -> Self {
        Self::new()
    }
}

/// The host clock as one callback sees it: read at the first [`CallbackClock::now_ns`], the same value
/// after. Each read is a host call (V8 to Envoy and back), and the flow asks for the time several times
/// in one callback (a leased request: 7 times over its 4 callbacks, 4 reads with this); a callback lasts
/// microseconds, so one reading serves all of it.
pub struct CallbackClock<F: Fn() -> u64> {
    read: F,
    at: std::cell::Cell<Option<u64>>,
}

impl<F: Fn() -> u64> CallbackClock<F> {
    /// A clock that reads `read` once.
    pub fn new(read: F) -> Self {
        CallbackClock {
            read,
            at: std::cell::Cell::new(None),
        }
    }

    /// The time of this callback, ns since the epoch.
    pub fn now_ns(&self) -> u64 {
        if let Some(t) = self.at.get() {
            return t;
        }
        let t = (self.read)();
        self.at.set(Some(t));
        t
    }
}

impl Host for EnvoyHost {
    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }
    fn recent_ns(&self) -> u64 {
        if let Some(t) = self.clock.at.get() {
            return t;
        }
        match LAST_NS.with(std::cell::Cell::get) {
            0 => self.clock.now_ns(),
            t => t,
        }
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
    fn differs(&self, name: &str) -> bool {
        abi::HeaderBlob::differs(self, name)
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
    fn differs(&self, name: &str) -> bool {
        self.blob
            .get_or_init(|| abi::HeaderBlob::get(self.map))
            .differs(name)
    }
}

#[cfg(test)]
mod tests {
    use super::CallbackClock;
    use std::cell::Cell;

    #[test]
    fn a_callback_clock_reads_the_host_once_and_keeps_that_time() {
        let reads = Cell::new(0u64);
        let clock = CallbackClock::new(|| {
            reads.set(reads.get() + 1);
            1_000 * reads.get()
        });
        assert_eq!(reads.get(), 0, "not read before it is asked");
        assert_eq!(clock.now_ns(), 1_000);
        assert_eq!(clock.now_ns(), 1_000);
        assert_eq!(clock.now_ns(), 1_000);
        assert_eq!(reads.get(), 1);
        // A new callback's clock reads the host again.
        let next = CallbackClock::new(|| {
            reads.set(reads.get() + 1);
            1_000 * reads.get()
        });
        assert_eq!(next.now_ns(), 2_000);
        assert_eq!(reads.get(), 2);
    }
}
