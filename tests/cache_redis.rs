//! The cache's shared tier (`storage: redis://...`) against Debian's real `redis-server`,
//! started by the test on a loopback port: two aralez instances share what one fetched; with
//! Redis down, or silent, requests go to the backend within a bounded delay (BYPASS) and are
//! counted; when Redis is back the tier is used again. What one instance purges or invalidates
//! leaves the other's memory too.

use crate::cache_support;
use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cache_support::*;
use http::Method;
use support::ports::free_port;
use support::redis::*;
use support::tools;
use support::*;

fn redis_cache(url: &str) -> String {
    format!("  storage: \"{url}\"\n  ttl: 60\n")
}

const ADMIN: &str = "config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\n";

async fn stored_in_redis(port: u16, key: &str) -> bool {
    let key = format!("aralez:cache:{key}");
    eventually_async(Duration::from_secs(5), || async {
        command(port, &["EXISTS", &key])
            .await
            .filter(|r| r.starts_with(":1"))
    })
    .await
    .is_some()
}

/// Redis and two instances caching in it, in front of one origin; `None` without Debian's
/// redis-server.
struct Pair {
    program: std::path::PathBuf,
    port: u16,
    redis: Redis,
    origin: Origin,
    first: ProxyProcess,
    second: ProxyProcess,
}

impl Pair {
    async fn start() -> Option<Pair> {
        let program = tools::find(&REDIS_SERVER)?;
        let port = free_port();
        let redis = Redis::start(&program, port).await;
        let origin = Origin::start().await;
        let first = proxy_cache(&origin, &redis_cache(&redis.url()), ADMIN);
        let second = proxy_cache(&origin, &redis_cache(&redis.url()), ADMIN);
        // Each instance empties its memory tier when its subscription to drops is in place
        // (drops sent before it are not delivered): the tests start once both are.
        for proxy in [&first, &second] {
            proxy
                .wait_log("following other instances' drops", Duration::from_secs(10))
                .await;
        }
        Some(Pair {
            program,
            port,
            redis,
            origin,
            first,
            second,
        })
    }
}

#[tokio::test]
async fn two_instances_share_entries_and_survive_redis_going_away() {
    let Some(Pair {
        program,
        port,
        redis,
        origin,
        first,
        second,
    }) = Pair::start().await
    else {
        return;
    };
    let mut a = Client::connect(Proto::H1, first.addr).await;
    let mut b = Client::connect(Proto::H2c, second.addr).await;

    let path = "/shared?cc=max-age=60";
    assert_eq!(
        get(&mut a, path).await,
        ("MISS".to_string(), "#1".to_string())
    );
    assert!(stored_in_redis(port, &format!("http://c.test{path}")).await);
    assert_eq!(
        get(&mut b, path).await,
        ("HIT".to_string(), "#1".to_string())
    );
    assert_eq!(
        origin.requests(),
        1,
        "a miss on one instance is a hit on the other"
    );
    let admin_b = second.logged_addr("admin API on http://");
    let read = metric(admin_b, "aralez_cache_hits_total{tier=\"redis\"}").await;
    assert_eq!(read, Some(1.0));

    // Redis goes away: requests still get answers, from the backend, promptly.
    drop(redis);
    let started = Instant::now();
    let (word, body) = get(&mut a, "/while-down?cc=max-age=60").await;
    assert_eq!((word.as_str(), body.as_str()), ("BYPASS", "#2"));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // What the memory tier holds is still served.
    assert_eq!(get(&mut a, path).await.0, "HIT");
    let admin = first.logged_addr("admin API on http://");
    let errors = metric(admin, "aralez_cache_errors_total{tier=\"redis\"}").await;
    assert!(errors >= Some(1.0), "{errors:?}");
    // The warning comes with the first failure: a lookup that only ran past its deadline (a
    // busy machine) is counted as an error but is not one yet, and the line is read from the
    // proxy's output a moment after it is written. Ask again until it is there.
    let warned = eventually_async(Duration::from_secs(5), || async {
        let mut c = Client::connect(Proto::H1, first.addr).await;
        let path = format!("/down-{}?cc=max-age=60", origin.requests());
        let (word, _) = get(&mut c, &path).await;
        first
            .log_text()
            .contains("cache: Redis unreachable")
            .then_some(word)
    })
    .await;
    assert_eq!(warned.as_deref(), Some("BYPASS"), "{}", first.log_text());
    // Losing the drops' channel is said too (it was silent).
    first
        .wait_log("cache: lost Redis channel", Duration::from_secs(5))
        .await;

    // Redis is back (same port): after the retry pause the tier is used again.
    let redis = Redis::start(&program, port).await;
    let back = eventually_async(Duration::from_secs(10), || async {
        let mut c = Client::connect(Proto::H1, first.addr).await;
        let path = format!("/back-{}?cc=max-age=60", origin.requests());
        let (word, _) = get(&mut c, &path).await;
        (word == "MISS").then_some(path)
    })
    .await
    .expect("the shared tier is used again");
    assert!(stored_in_redis(port, &format!("http://c.test{back}")).await);
    assert_eq!(get(&mut b, &back).await.0, "HIT");
    drop(redis);
}

#[tokio::test]
async fn a_silent_redis_delays_a_request_by_a_bounded_time() {
    // Something that accepts connections on the Redis port and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = silent.local_addr().expect("address");
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let origin = Origin::start().await;
    let proxy = proxy_cache(&origin, &redis_cache(&format!("redis://{addr}/0")), ADMIN);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    for i in 0..3 {
        let started = Instant::now();
        let (word, body) = get(&mut c, &format!("/s{i}?cc=max-age=60")).await;
        assert_eq!(word, "BYPASS");
        assert!(body.starts_with('#'));
        // 50 ms for the lookup at most, then the backend.
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }
    // A purge that could not reach the shared tier says so (it answered 200, purged: 1, and
    // the answer kept being served from Redis).
    let admin = proxy.logged_addr("admin API on http://");
    for json in [
        "{\"url\": \"http://c.test/s0?cc=max-age=60\"}",
        "{\"host\": \"c.test\", \"prefix\": \"/\"}",
    ] {
        let (status, body) = purge(admin, "k", json).await;
        assert_eq!(status, 503, "{json}: {body}");
        assert!(body.contains("shared tier, did not answer"), "{body}");
    }
    held.abort();
}

#[tokio::test]
async fn what_one_instance_drops_leaves_every_instances_memory() {
    let Some(Pair {
        program: _,
        port,
        redis,
        origin: _origin,
        first,
        second,
    }) = Pair::start().await
    else {
        return;
    };
    let admin_a = first.logged_addr("admin API on http://");
    let mut a = Client::connect(Proto::H1, first.addr).await;
    let mut b = Client::connect(Proto::H1, second.addr).await;
    in_both(&mut a, &mut b, port, "/u?cc=max-age=60").await;
    let url = "{\"url\": \"http://c.test/u?cc=max-age=60\"}";
    assert_eq!(purge(admin_a, "k", url).await.0, 200);
    assert!(
        misses_soon(&mut b, "/u?cc=max-age=60").await,
        "purged by URL"
    );

    in_both(&mut a, &mut b, port, "/p/x?cc=max-age=60").await;
    let prefix = "{\"host\": \"c.test\", \"prefix\": \"/p\"}";
    assert_eq!(purge(admin_a, "k", prefix).await.0, 200);
    assert!(
        misses_soon(&mut b, "/p/x?cc=max-age=60").await,
        "purged by prefix"
    );

    in_both(&mut a, &mut b, port, "/w?cc=max-age=60").await;
    let (resp, _) = send(&mut a, Method::POST, "/w?cc=max-age=60", &[]).await;
    assert!(resp.status().is_success());
    assert!(
        misses_soon(&mut b, "/w?cc=max-age=60").await,
        "invalidated by a POST"
    );
    drop(redis);
}

/// Puts `path` in both instances' memories: a miss on `a`, read from Redis by `b`.
async fn in_both(a: &mut Client, b: &mut Client, port: u16, path: &str) {
    assert_eq!(get(a, path).await.0, "MISS", "{path}");
    assert!(stored_in_redis(port, &format!("http://c.test{path}")).await);
    assert_eq!(get(b, path).await.0, "HIT", "{path}");
    assert_eq!(get(b, path).await.0, "HIT", "{path}");
}

/// `path` is a miss within 5 s (a drop travels through Redis).
async fn misses_soon(c: &mut Client, path: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if get(c, path).await.0 == "MISS" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
