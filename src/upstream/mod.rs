//! Backends: addresses, passive health, per-worker connection pools, and sending requests.
//!
//! Only this module opens connections to backends.
pub mod backend;
mod connect;
pub mod detect;
mod h2_settings;
pub mod health;
pub mod oneshot;
pub mod pool;
pub mod resolve;
pub mod tls;

pub use backend::{Backend, Protocol, Registry, Wire};
pub use pool::{send, set_worker_index, PooledBody, SendError, Timeouts, UpBody};
