use super::render::escape;
use super::*;

#[test]
fn counts_add_up_across_shards() {
    let metrics = Metrics::new(2);
    for worker in (0..3).map(WorkerId) {
        metrics.request_started(worker, &Method::GET, Version::HTTP_11);
        let brew = Method::from_bytes(b"BREW").unwrap();
        metrics.request_started(worker, &brew, Version::HTTP_2);
        let teapot = StatusCode::IM_A_TEAPOT;
        metrics.response_ready(worker, teapot, Duration::from_millis(3), None);
    }
    let text = metrics.render_prometheus(std::iter::empty());
    assert!(
        text.contains("aralez_responses_total{status=\"418\"} 3\n"),
        "{text}"
    );
    assert!(text.contains("aralez_requests_total{method=\"OTHER\",version=\"HTTP/2\"} 3\n"));
    assert!(text.contains("aralez_requests_total{method=\"GET\",version=\"HTTP/1.1\"} 3\n"));
    // Aralez's own families, for its dashboards.
    assert!(
        text.contains("aralez_requests_by_method_total{method=\"GET\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("aralez_requests_by_version_total{version=\"HTTP/2\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains("aralez_response_latency_seconds_bucket{le=\"5\"}"),
        "{text}"
    );
    assert!(text.contains("aralez_logging_errors 0\n"), "{text}");
    assert_eq!(metrics.requests(), 6);
    assert!(text.contains("aralez_response_latency_seconds_bucket{le=\"0.005\"} 3\n"));
    assert!(text.contains("aralez_response_latency_seconds_bucket{le=\"0.0025\"} 0\n"));
}

#[test]
fn totals_sum_the_shards_by_status_class_and_latency_bucket() {
    let metrics = Metrics::new(1);
    let cases = [(200, 2), (204, 3), (404, 30), (503, 20_000), (101, 1)];
    for (worker, (status, ms)) in cases.into_iter().enumerate() {
        let worker = WorkerId(worker % 2);
        metrics.request_started(worker, &Method::GET, Version::HTTP_11);
        let status = StatusCode::from_u16(status).unwrap();
        metrics.response_ready(worker, status, Duration::from_millis(ms), None);
    }
    let totals = metrics.totals();
    assert_eq!(totals.requests, 5);
    assert_eq!(totals.responses, [1, 2, 0, 1, 1]);
    let mut buckets = [0; BUCKETS.len() + 1];
    buckets[0] = 1; // 1 ms
    buckets[1] = 1; // 2 ms
    buckets[2] = 1; // 3 ms
    buckets[5] = 1; // 30 ms
    buckets[BUCKETS.len()] = 1; // 20 s, past the largest bound
    assert_eq!(totals.latency_buckets, buckets);
    assert_eq!(totals.latency_sum_micros, 20_036_000);
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    assert_eq!(escape("plain"), "plain");
}

/// Per-backend counts of backends no longer configured are forgotten at a scrape, and their
/// places go to new backends (churned pods kept theirs, and new ones counted as `other`).
#[test]
fn gone_backends_leave_the_upstream_counts_and_make_room() {
    let metrics = Metrics::new(1);
    let worker = WorkerId(0);
    let answered = |label: &str| {
        let ok = StatusCode::OK;
        metrics.response_ready(worker, ok, Duration::from_millis(1), Some(label));
    };
    for pod in 0..MAX_UPSTREAMS {
        answered(&format!("10.0.0.{pod}:80"));
    }
    answered("10.1.0.1:80");
    let up = |backend: &'static str| BackendUp {
        host: "a.test",
        path: "/",
        backend,
        up: true,
    };
    let text = metrics.render_prometheus([up("10.0.0.7:80")].into_iter());
    assert!(
        text.contains("aralez_upstream_responses_total{upstream=\"other\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("{upstream=\"10.0.0.7:80\"} 1\n"), "{text}");
    assert!(!text.contains("10.0.0.8:80"), "{text}");
    answered("10.1.0.2:80");
    let text = metrics.render_prometheus([up("10.1.0.2:80")].into_iter());
    assert!(text.contains("{upstream=\"10.1.0.2:80\"} 1\n"), "{text}");
}

/// Failed exchanges count per backend and reason, retries per backend; a backend that only
/// failed has no responses line, and a gone one is forgotten with its failures.
#[test]
fn upstream_failures_and_retries_count_per_backend() {
    let metrics = Metrics::new(2);
    let (first, second) = (WorkerId(0), WorkerId(1));
    metrics.upstream_failed(first, "10.0.0.1:80", UpstreamFailure::Reset);
    metrics.upstream_failed(second, "10.0.0.1:80", UpstreamFailure::Reset);
    metrics.upstream_failed(first, "10.0.0.1:80", UpstreamFailure::Timeout);
    metrics.upstream_failed(WorkerId(9), "10.0.0.2:80", UpstreamFailure::Cut);
    metrics.upstream_retried(second, "10.0.0.1:80");
    let up = |backend: &'static str| BackendUp {
        host: "a.test",
        path: "/",
        backend,
        up: true,
    };
    let text = metrics.render_prometheus([up("10.0.0.1:80"), up("10.0.0.2:80")].into_iter());
    for line in [
        "aralez_upstream_failures_total{upstream=\"10.0.0.1:80\",reason=\"reset\"} 2\n",
        "aralez_upstream_failures_total{upstream=\"10.0.0.1:80\",reason=\"timeout\"} 1\n",
        "aralez_upstream_failures_total{upstream=\"10.0.0.2:80\",reason=\"cut\"} 1\n",
        "aralez_upstream_retries_total{upstream=\"10.0.0.1:80\"} 1\n",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert!(!text.contains("reason=\"connect\""), "{text}");
    assert!(!text.contains("aralez_upstream_responses_total{"), "{text}");
    let text = metrics.render_prometheus([up("10.0.0.2:80")].into_iter());
    assert!(!text.contains("10.0.0.1:80"), "{text}");
}
