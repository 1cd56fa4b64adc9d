//! The admin side's short memory of the traffic, for the status page: a control-plane task
//! reads the request counters ([`Metrics::totals`]) every [`INTERVAL`] and keeps what changed
//! in each interval in a bounded ring of [`CAPACITY`] samples (five minutes), so a page opened
//! now already shows the last minutes. It reads only what the workers already count: the
//! request path never sees it. It also turns totals into the JSON `/status?history` answers.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::{Metrics, Totals, LATENCY_BOUNDS};

/// How often the counters are sampled.
pub const INTERVAL: Duration = Duration::from_secs(5);
/// Samples kept: [`INTERVAL`] x 60 = five minutes.
pub const CAPACITY: usize = 60;
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// What happened in one interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// When the interval ended.
    pub at: Instant,
    /// How long it lasted (about [`INTERVAL`]; longer when the runtime was late).
    pub seconds: f64,
    /// The counters' growth over the interval.
    pub delta: Totals,
}

/// The ring of recent samples, shared by the sampler (writes) and the admin API (reads).
pub struct History {
    interval: Duration,
    capacity: usize,
    samples: Mutex<VecDeque<Sample>>,
}

impl Default for History {
    fn default() -> History {
        History::new(INTERVAL, CAPACITY)
    }
}

impl History {
    /// A ring of `capacity` samples (at least one), taken every `interval` once [`History::run`]
    /// runs.
    pub fn new(interval: Duration, capacity: usize) -> History {
        let capacity = capacity.max(1);
        History {
            interval,
            capacity,
            samples: Mutex::new(VecDeque::with_capacity(capacity)),
        }
    }

    /// The samples kept, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .map(|ring| ring.iter().copied().collect())
            .unwrap_or_default()
    }

    fn push(&self, sample: Sample) {
        let Ok(mut ring) = self.samples.lock() else {
            return;
        };
        if ring.len() == self.capacity {
            ring.pop_front();
        }
        ring.push_back(sample);
    }

    /// Samples `metrics` every interval (the first sample one interval after the start) until
    /// `shutdown` turns true or its sender is gone.
    pub async fn run(self: Arc<Self>, metrics: Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        let mut last = (Instant::now(), metrics.totals());
        let stop = shutdown.wait_for(|stopping| *stopping);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = ticks.tick() => {}
            }
            let now = (Instant::now(), metrics.totals());
            self.push(Sample {
                at: now.0,
                seconds: now.0.duration_since(last.0).as_secs_f64(),
                delta: growth(&last.1, &now.1),
            });
            last = now;
        }
    }

    /// `{interval_seconds, capacity, samples: [...]}`, oldest sample first, each with its age
    /// at `now`.
    pub fn to_json(&self, now: Instant) -> Value {
        let samples: Vec<Value> = self
            .samples()
            .iter()
            .map(|s| {
                let mut entry = totals_json(&s.delta);
                let rate = if s.seconds > 0.0 {
                    s.delta.requests as f64 / s.seconds
                } else {
                    0.0
                };
                entry["age_seconds"] = json!(round3(now.duration_since(s.at).as_secs_f64()));
                entry["seconds"] = json!(round3(s.seconds));
                entry["rate"] = json!(round3(rate));
                entry
            })
            .collect();
        json!({
            "interval_seconds": self.interval.as_secs_f64(),
            "capacity": self.capacity,
            "samples": samples,
        })
    }
}

/// What `now` counted that `before` had not (zero where a counter read went backwards).
fn growth(before: &Totals, now: &Totals) -> Totals {
    let mut delta = Totals {
        requests: now.requests.saturating_sub(before.requests),
        latency_sum_micros: now
            .latency_sum_micros
            .saturating_sub(before.latency_sum_micros),
        ..Totals::default()
    };
    for (d, (b, n)) in delta
        .responses
        .iter_mut()
        .zip(before.responses.iter().zip(&now.responses))
    {
        *d = n.saturating_sub(*b);
    }
    for (d, (b, n)) in delta
        .latency_buckets
        .iter_mut()
        .zip(before.latency_buckets.iter().zip(&now.latency_buckets))
    {
        *d = n.saturating_sub(*b);
    }
    delta
}

/// `{requests, responses: {"1xx": n, ...}, latency_ms: {p50, p99, mean}}`; the latencies are
/// null when no response was counted.
pub fn totals_json(totals: &Totals) -> Value {
    let responses: serde_json::Map<String, Value> = CLASSES
        .iter()
        .zip(totals.responses)
        .map(|(class, n)| ((*class).to_string(), json!(n)))
        .collect();
    let count: u64 = totals.latency_buckets.iter().sum();
    let mean = (count > 0).then(|| totals.latency_sum_micros as f64 / count as f64 / 1000.0);
    let ms = |q| quantile(q, &totals.latency_buckets).map(|s| round3(s * 1000.0));
    json!({
        "requests": totals.requests,
        "responses": responses,
        "latency_ms": { "p50": ms(0.5), "p99": ms(0.99), "mean": mean.map(round3) },
    })
}

/// The `q` quantile (seconds) estimated from per-bucket counts as Prometheus'
/// `histogram_quantile` does: linear within the bucket it falls in; past the largest bound, that
/// bound. `None` with no observation.
pub fn quantile(q: f64, buckets: &[u64]) -> Option<f64> {
    let count: u64 = buckets.iter().sum();
    if count == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * count as f64;
    let mut below = 0u64;
    for (index, n) in buckets.iter().enumerate() {
        let Some(upper) = LATENCY_BOUNDS.get(index) else {
            break;
        };
        if *n > 0 && (below + n) as f64 >= rank {
            let lower = index
                .checked_sub(1)
                .and_then(|i| LATENCY_BOUNDS.get(i))
                .copied()
                .unwrap_or(0.0);
            let within = (rank - below as f64) / *n as f64;
            return Some(lower + (upper - lower) * within);
        }
        below += n;
    }
    LATENCY_BOUNDS.last().copied()
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::WorkerId;
    use http::{Method, StatusCode, Version};

    fn serve(metrics: &Metrics, status: u16, ms: u64) {
        metrics.request_started(WorkerId(0), &Method::GET, Version::HTTP_11);
        let status = StatusCode::from_u16(status).unwrap();
        metrics.response_ready(WorkerId(0), status, Duration::from_millis(ms), None);
    }

    /// Lets the sampler run up to now (the paused clock moves only when told).
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn samples_each_interval_and_keeps_only_the_last_ones() {
        let metrics = Arc::new(Metrics::new(1));
        let history = Arc::new(History::new(Duration::from_secs(5), 3));
        let (stop_tx, stop) = watch::channel(false);
        let sampler = tokio::spawn(history.clone().run(metrics.clone(), stop));
        settle().await;
        serve(&metrics, 200, 2);
        tokio::time::advance(Duration::from_millis(4_999)).await;
        settle().await;
        assert!(
            history.samples().is_empty(),
            "no sample before one interval"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        let samples = history.samples();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].delta.requests, 1);
        assert_eq!(samples[0].delta.responses, [0, 1, 0, 0, 0]);
        assert_eq!(samples[0].seconds, 5.0);
        for round in 1..=4u64 {
            for _ in 0..round {
                serve(&metrics, 404, 30);
            }
            tokio::time::advance(Duration::from_secs(5)).await;
            settle().await;
        }
        let samples = history.samples();
        let requests: Vec<u64> = samples.iter().map(|s| s.delta.requests).collect();
        assert_eq!(
            requests,
            [2, 3, 4],
            "the ring keeps the last three, oldest first"
        );
        assert_eq!(samples[2].delta.responses[3], 4);
        let json = history.to_json(Instant::now());
        assert_eq!(json["samples"][2]["rate"], 0.8);
        assert_eq!(json["samples"][2]["age_seconds"], 0.0);
        assert_eq!(json["samples"][0]["age_seconds"], 10.0);
        assert_eq!(json["samples"][2]["responses"]["4xx"], 4);
        stop_tx.send(true).unwrap();
        settle().await;
        assert!(sampler.is_finished(), "the sampler stops on shutdown");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_tick_measures_the_interval_it_really_covered() {
        let metrics = Arc::new(Metrics::new(1));
        let history = Arc::new(History::new(Duration::from_secs(5), 10));
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(history.clone().run(metrics.clone(), stop));
        settle().await;
        // The runtime was busy for 12 s: one late sample, then back on a 5 s beat.
        tokio::time::advance(Duration::from_secs(12)).await;
        settle().await;
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
        let seconds: Vec<f64> = history.samples().iter().map(|s| s.seconds).collect();
        assert_eq!(seconds, [12.0, 5.0]);
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let mut buckets = [0u64; LATENCY_BOUNDS.len() + 1];
        assert_eq!(quantile(0.5, &buckets), None);
        // 100 responses between 25 and 50 ms: the median halfway through that bucket.
        buckets[5] = 100;
        let p50 = quantile(0.5, &buckets).unwrap();
        assert!((p50 - 0.0375).abs() < 1e-9, "{p50}");
        // One very slow response: p99 stays in the 25-50 ms bucket, p100 is the largest bound.
        buckets[LATENCY_BOUNDS.len()] = 1;
        assert!(quantile(0.99, &buckets).unwrap() <= 0.05);
        assert_eq!(quantile(1.0, &buckets), Some(10.0));
        let json = totals_json(&Totals {
            requests: 101,
            responses: [0, 101, 0, 0, 0],
            latency_buckets: buckets,
            latency_sum_micros: 101_000,
        });
        assert_eq!(json["latency_ms"]["p50"], 37.625);
        assert_eq!(json["latency_ms"]["mean"], 1.0);
        assert_eq!(json["responses"]["2xx"], 101);
    }
}
