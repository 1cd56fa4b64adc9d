//! Per-backend counts: the responses a backend sent, the exchanges that failed with it by why
//! (HAProxy's `econ`, `eresp`), and the requests that went on to another attempt after it failed
//! them (HAProxy's `wretr`, `wredis`). Each shard keeps at most [`MAX_UPSTREAMS`] labels; more
//! count as `other`.

use std::sync::Mutex;

use super::MAX_UPSTREAMS;

/// Why an exchange with a backend failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// No connection: refused, unreachable, timed out, or its TLS handshake failed.
    Connect,
    /// The backend had as many connections as it may (`upstream_max_connections`).
    Busy,
    /// No response head within the response timeout.
    Timeout,
    /// The connection broke, or the stream was reset, before the response head.
    Reset,
    /// The answer was not HTTP, or its status was outside 100..=599.
    BadResponse,
    /// The answer was cut after its head.
    Cut,
}

impl UpstreamFailure {
    pub(super) const ALL: [UpstreamFailure; 6] = [
        UpstreamFailure::Connect,
        UpstreamFailure::Busy,
        UpstreamFailure::Timeout,
        UpstreamFailure::Reset,
        UpstreamFailure::BadResponse,
        UpstreamFailure::Cut,
    ];

    /// The `reason` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamFailure::Connect => "connect",
            UpstreamFailure::Busy => "busy",
            UpstreamFailure::Timeout => "timeout",
            UpstreamFailure::Reset => "reset",
            UpstreamFailure::BadResponse => "bad_response",
            UpstreamFailure::Cut => "cut",
        }
    }
}

/// One backend's counts in one shard.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct UpstreamCounts {
    pub label: Box<str>,
    pub responses: u64,
    pub failures: [u64; UpstreamFailure::ALL.len()],
    pub retried: u64,
}

impl UpstreamCounts {
    fn add(&mut self, other: &UpstreamCounts) {
        self.responses += other.responses;
        for (sum, n) in self.failures.iter_mut().zip(other.failures) {
            *sum += n;
        }
        self.retried += other.retried;
    }
}

/// Counts one event of `label`'s with `count`: in its own entry, or `other`'s once the shard
/// has [`MAX_UPSTREAMS`] labels.
pub(super) fn count(
    list: &Mutex<Vec<UpstreamCounts>>,
    label: &str,
    count: impl FnOnce(&mut UpstreamCounts),
) {
    let Ok(mut list) = list.lock() else {
        return;
    };
    let label = if list.len() < MAX_UPSTREAMS || list.iter().any(|c| &*c.label == label) {
        label
    } else {
        "other"
    };
    match list.iter_mut().find(|c| &*c.label == label) {
        Some(entry) => count(entry),
        None => {
            let mut entry = UpstreamCounts {
                label: label.into(),
                ..UpstreamCounts::default()
            };
            count(&mut entry);
            list.push(entry);
        }
    }
}

/// The shards' counts summed per label, in label order.
pub(super) fn summed<'a>(
    lists: impl Iterator<Item = &'a Mutex<Vec<UpstreamCounts>>>,
) -> Vec<UpstreamCounts> {
    let mut totals: Vec<UpstreamCounts> = Vec::new();
    for list in lists {
        let Ok(list) = list.lock() else {
            continue;
        };
        for counts in list.iter() {
            match totals.iter_mut().find(|t| t.label == counts.label) {
                Some(total) => total.add(counts),
                None => totals.push(counts.clone()),
            }
        }
    }
    totals.sort();
    totals
}
