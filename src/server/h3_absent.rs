//! HTTP/3 in a binary built without the `http3` feature (Cargo.toml): the same start-up API as
//! the QUIC server, whose start fails and says why, so `http3: true` is never ignored quietly.

use tokio::sync::watch;

use super::{H3Side, Limits, Serving};

/// Why HTTP/3 could not start.
#[derive(Debug, thiserror::Error)]
pub enum H3Error {
    #[error("this binary was built without the `http3` feature")]
    NotBuilt,
}

/// Fails: there is no QUIC server in this binary.
pub fn spawn(
    _side: H3Side,
    _serving: Serving,
    _limits: Limits,
    _threads: usize,
    _shutdown: watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>, H3Error> {
    Err(H3Error::NotBuilt)
}
