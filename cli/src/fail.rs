//! Every way a command fails, as one line on stderr and an exit code a script can test.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done (`check`: every configuration found is valid) |
//! | 1 | an invalid configuration (the filter would refuse it) |
//! | 2 | a bad command line, or a file that cannot be read or holds no filter configuration |
//! | 3 | Redis cannot be reached, or answered with an error |
//! | 4 | Redis holds keys of another key schema version than this tokengate's |
//! | 5 | the configuration does not match what Redis holds (a budget it does not define, …) |

/// A failure: what to print and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Exit code (see the module table).
    pub code: u8,
    /// One line (or a short list) saying what is wrong and what to do.
    pub message: String,
}

impl Failure {
    /// An invalid configuration (exit 1).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }
    /// A bad argument or input file (exit 2).
    pub fn input(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }
    /// Redis unreachable or failing (exit 3).
    pub fn redis(message: impl Into<String>) -> Self {
        Self {
            code: 3,
            message: message.into(),
        }
    }
    /// Another key schema version (exit 4).
    pub fn schema(message: impl Into<String>) -> Self {
        Self {
            code: 4,
            message: message.into(),
        }
    }
    /// The configuration does not match Redis (exit 5).
    pub fn mismatch(message: impl Into<String>) -> Self {
        Self {
            code: 5,
            message: message.into(),
        }
    }
}
