//! Unit tests of the backend registry and a backend's health, detection and names.

use super::*;
use crate::config::values::parse_server;

#[test]
fn entries_no_snapshot_holds_are_swept_as_the_registry_grows() {
    let reg = Registry::for_tests(1, Duration::from_secs(1));
    let spec = |i: u32| parse_server(&format!("127.1.{}.{}:80", i / 250, i % 250)).unwrap();
    let held: Vec<_> = (0..1000).map(|i| reg.backend(&spec(i), false)).collect();
    for i in 1000..3000 {
        drop(reg.backend(&spec(i), false));
    }
    let live = reg.live.lock().unwrap();
    let (entries, sweep_at) = (live.backends.len(), live.sweep_at);
    drop(live);
    assert!(entries < 2 * 1000 + 64, "dropped ones swept: {entries}");
    assert!(
        sweep_at >= 2 * 1000,
        "the next sweep waits for the map to double"
    );
    for (i, backend) in held.iter().enumerate() {
        assert!(Arc::ptr_eq(backend, &reg.backend(&spec(i as u32), false)));
    }
}

#[test]
fn the_connection_limit_is_said_once_a_second_with_how_many_met_it() {
    let reg = Registry::for_tests(1, Duration::from_secs(1));
    let backend = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
    backend.say_at_capacity(&"connection limit: 1 connections open");
    for _ in 0..5 {
        backend.say_at_capacity(&"connection limit: 1 connections open");
    }
    assert_eq!(
        backend.capacity_unsaid.load(Ordering::Relaxed),
        5,
        "held back"
    );
}

#[test]
fn a_route_of_an_ip_address_asks_for_the_backends_own_name() {
    let reg = Registry::for_tests(1, Duration::from_secs(1));
    let backend = reg.backend(&parse_server("localhost:443").unwrap(), false);
    for (route, asked) in [
        ("app.test", "app.test"),
        ("DEFAULT", "localhost"),
        ("[::5]", "localhost"),
        ("[2001:db8::1]", "localhost"),
        ("10.0.0.5", "localhost"),
    ] {
        assert_eq!(backend.server_name_for(route), asked, "{route}");
    }
}

#[test]
fn registry_reuses_live_backends() {
    let reg = Registry::for_tests(2, Duration::from_secs(1));
    let spec = parse_server("127.0.0.1:9").unwrap();
    let a = reg.backend(&spec, false);
    let b = reg.backend(&spec, false);
    assert!(Arc::ptr_eq(&a, &b));
    drop((a, b));
    let c = reg.backend(&spec, false);
    assert_eq!(&*c.label, "127.0.0.1:9");
    assert_eq!(c.idle_max(WorkerId(0)) + c.idle_max(WorkerId(1)), 8);
}

/// The pool size is split across the workers, its total the size however it divides, one
/// each at least while it is not 0.
#[test]
fn the_pool_size_is_the_total_across_workers() {
    let cases = [
        (4, 0, [0; 4]),
        (4, 1, [1; 4]),
        (4, 6, [2, 2, 1, 1]),
        (4, 8, [2; 4]),
    ];
    for (workers, size, shares) in cases {
        let metrics = Arc::new(Metrics::new(workers));
        let reg = Registry::new(workers, size, Duration::from_secs(1), metrics);
        let backend = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
        let got: Vec<usize> = (0..4).map(|w| backend.idle_max(WorkerId(w))).collect();
        assert_eq!(got, shares, "{size} across {workers} workers");
    }
}

#[test]
fn host_names_resolve_and_re_resolve_without_change() {
    let reg = Registry::for_tests(1, Duration::from_secs(1));
    let named = reg.backend(&parse_server("localhost:8080").unwrap(), false);
    assert!(named
        .addrs()
        .iter()
        .any(|a| a.ip().is_loopback() && a.port() == 8080));
    assert!(!named.re_resolve(), "same answer: nothing swapped");
    let literal = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
    assert!(!literal.re_resolve(), "IP literals are never looked up");
    let missing = reg.backend(&parse_server("no-such-host.invalid:80").unwrap(), false);
    assert!(missing.addrs().is_empty());
    assert!(
        !missing.re_resolve(),
        "a failed lookup keeps what there was"
    );
}

#[test]
fn passive_health_marks_down_after_three_failures() {
    let reg = Registry::for_tests(1, Duration::from_secs(60));
    let b = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
    b.connect_failed();
    b.connect_failed();
    assert!(b.is_up());
    b.connect_failed();
    assert!(!b.is_up());
    b.connect_succeeded();
    assert!(b.is_up());
}

/// Once a mark lapses, one request tries the backend and the others pass it by, until the
/// trial says whether it is back: each request of its round-robin share waited for its own
/// connect timeout. Each failed trial doubles the mark, up to `LONGEST_MARK`; the trial holds
/// the mark for as long as its connect may take.
#[tokio::test(start_paused = true)]
async fn a_lapsed_mark_lets_one_request_try_ever_more_rarely() {
    let connect = Duration::from_secs(1);
    let reg = Registry::for_tests(1, Duration::from_secs(2));
    let b = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
    // Eight connects out at once: three mark it, the other five fail within the mark and
    // leave it as long as it was (they took it straight to the longest).
    for _ in 0..8 {
        b.connect_failed();
    }
    assert!(!b.claim_trial(connect) && b.passively_marked(), "marked");
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(
        b.passive_up() && b.passively_marked(),
        "lapsed, still marked"
    );
    assert!(b.claim_trial(connect), "the trial");
    assert!(
        !b.claim_trial(connect) && !b.passive_up(),
        "the others pass it by meanwhile"
    );
    // Failed trials: marked for 4, 8, 16 s, then 30 s (the longest) each time.
    for mark in [4, 8, 16, 30, 30] {
        b.connect_failed();
        tokio::time::advance(Duration::from_secs(mark - 1)).await;
        assert!(!b.claim_trial(connect), "marked for {mark} s");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(b.claim_trial(connect), "the trial after {mark} s");
    }
    b.connect_succeeded();
    assert!(
        b.claim_trial(connect) && b.claim_trial(connect),
        "back in rotation"
    );
    assert!(!b.passively_marked());
    // Marked again: for hc_interval, the first mark's length, again.
    for _ in 0..3 {
        b.connect_failed();
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(b.claim_trial(connect), "the trial");
    // A trial answered over a pooled connection (no connect made) ends the mark too.
    b.note_answer(WorkerId(0), http::StatusCode::OK);
    assert!(
        b.claim_trial(connect) && b.claim_trial(connect),
        "answered: back in rotation"
    );
    // A trial whose connect may take 10 s holds the mark that long: no second trial at 2 s.
    for _ in 0..3 {
        b.connect_failed();
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(b.claim_trial(Duration::from_secs(10)), "the trial");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(
        !b.claim_trial(connect),
        "the first trial's connect is still out"
    );
    tokio::time::advance(Duration::from_secs(7)).await;
    assert!(b.claim_trial(connect), "it never said: another trial");
}

#[tokio::test]
async fn connections_opened_before_the_addresses_changed_are_not_pooled_again() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let reg = Registry::for_tests(1, Duration::from_secs(60));
    let b = reg.backend(&parse_server(&addr.to_string()).unwrap(), false);
    let limit = Duration::from_secs(5);
    let idle = b.connect_inline(limit).await.unwrap();
    let busy = b.connect_inline(limit).await.unwrap();
    let worker = WorkerId(0);
    b.keep_inline(worker, idle);
    b.use_addrs(Box::new([addr]));
    assert!(
        b.slot(worker).take_inline().is_none(),
        "the idle one is closed"
    );
    b.keep_inline(worker, busy);
    assert!(
        b.slot(worker).take_inline().is_none(),
        "the busy one is not kept"
    );
    let fresh = b.connect_inline(limit).await.unwrap();
    b.keep_inline(worker, fresh);
    assert!(
        b.slot(worker).take_inline().is_some(),
        "one opened since is kept"
    );
    // hyper's (TLS backends): one whose request set out before the change is not kept.
    let hyper_conn = || async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let io = hyper_util::rt::TokioIo::new(tcp);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        send.ready().await.unwrap();
        send
    };
    let before = b.addrs_generation();
    b.use_addrs(Box::new([addr]));
    b.keep_hyper(worker, (None, before), hyper_conn().await);
    assert!(
        b.slot(worker).take_idle(None).is_none(),
        "busy across the change"
    );
    b.keep_hyper(worker, (None, b.addrs_generation()), hyper_conn().await);
    assert!(b.slot(worker).take_idle(None).is_some(), "sent since");
    accepting.abort();
}

#[test]
fn probes_decide_and_a_pass_clears_passive_marking() {
    let reg = Registry::for_tests(1, Duration::from_secs(60));
    let b = reg.backend(&parse_server("127.0.0.1:9").unwrap(), false);
    b.set_probed("x.test", "/", Err("status 503"));
    assert!(!b.is_up());
    assert!(b.passive_up());
    for _ in 0..3 {
        b.connect_failed();
    }
    b.set_probed("x.test", "/", Ok(()));
    assert!(
        b.is_up(),
        "a passing probe brings a passively marked backend back"
    );
}
