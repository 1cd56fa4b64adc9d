//! Backends: addresses, passive health, protocol detection, per-worker connection pools, the one
//! connector every upstream exchange goes through, and the balancer that picks backends and
//! fails over.
//!
//! Only this module opens connections to upstreams (backends, health probes, forward auth) and
//! to the other HTTP services aralez calls (`call`: cluster workers, DNS providers' APIs).
pub mod backend;
pub mod balancer;
pub mod call;
pub mod connector;
pub mod detect;
mod h2_settings;
mod idle_list;
pub mod inline;
pub mod lookup;
pub mod pool;
pub mod pooled_body;
mod refused;
mod slot;
pub mod stall;
pub mod tls;

pub use backend::{Backend, Registry};
pub use balancer::{BackendSet, Failed, Outgoing, Pinned};
pub use connector::{ConnectError, ConnectErrorKind, Endpoint, UpBody, Wire};
pub use pool::{SendError, Timeouts};
pub use pooled_body::{keep_served_by, served_by, FailedAt, PooledBody, Served, ServedBy};
