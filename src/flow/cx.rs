//! What every flow function works with ([`Cx`]): the configuration, the host's view for this callback,
//! this VM's state, and the effects the callback has asked for so far.
//!
//! Shared data is read and written synchronously through [`Cx::store`] (the [`SharedStore`] port: a
//! host call each); everything else the host does is asked for as an [`Effect`] and applied after the
//! callback returns.

use super::effect::{Effect, Host, Level};
use super::logs;
use super::metric::Metric;
use super::vm::state::Worker;
use crate::config::Config;
use crate::store::SharedStore;

/// What every flow function works with.
pub struct Cx<'a> {
    /// The configuration.
    pub cfg: &'a Config,
    /// The host view.
    pub host: &'a dyn Host,
    /// This VM's state.
    pub worker: &'a mut Worker,
    /// Effects, appended in order.
    pub fx: &'a mut Vec<Effect>,
}

impl Cx<'_> {
    /// Host time.
    pub fn now(&self) -> u64 {
        self.host.now_ns()
    }
    /// Shared data.
    pub fn store(&self) -> &dyn SharedStore {
        self.host.store()
    }
    /// Counts one.
    pub fn inc(&mut self, m: Metric) {
        self.fx.push(Effect::Count(m, 1));
    }
    /// Counts `n` (nothing for 0).
    pub fn add(&mut self, m: Metric, n: u64) {
        if n > 0 {
            self.fx.push(Effect::Count(m, n));
        }
    }
    /// Logs one line, unconditionally (transitions, configuration).
    pub fn log(&mut self, level: Level, msg: String) {
        self.fx.push(Effect::Log(level, msg));
    }
    /// Logs a line about a failing dependency, rate-limited per `cause` (see [`logs::LogGate`]).
    pub fn log_failure(&mut self, level: Level, cause: &'static str, msg: String) {
        let now = self.now();
        match self.worker.logs.admit(cause, now) {
            logs::Gate::Log { suppressed } => {
                let line = if suppressed > 0 {
                    format!("{msg} ({suppressed} more like it suppressed)")
                } else {
                    msg
                };
                self.fx.push(Effect::Log(level, line));
            }
            logs::Gate::Suppress => self.inc(Metric::LogsSuppressed),
        }
    }
}
