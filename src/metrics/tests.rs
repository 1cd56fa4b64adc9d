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
