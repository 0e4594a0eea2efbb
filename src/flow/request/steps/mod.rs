//! The steps of the pipeline, one file each; [`super::pipeline`] lists them in order.

pub mod body_size;
pub mod breakers;
pub mod cluster_breaker;
pub mod edits;
pub mod estimate;
pub mod fair;
pub mod global;
pub mod identity;
pub mod limits;
pub mod model_breaker;
pub mod precheck;
pub mod quota;
pub mod quota_marker;
