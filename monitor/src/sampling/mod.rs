//! Which interfaces are watched, and what the kernel counted on each of them.

pub mod link_watch;
pub mod sampler;
