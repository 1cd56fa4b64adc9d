//! `limits_store: redis://...` through the real binary: three aralez instances and Debian's
//! `redis-server` started by the test. A client spread over the three gets its limit (plus the
//! stated error bound), not three times it; another client is unaffected; a 4xx block made on two
//! instances holds on the third; with Redis killed every request is still answered promptly
//! (each instance then counts on its own), and the limits are shared again once Redis is back.

use crate::support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::Method;
use support::ports::free_port;
use support::redis::*;
use support::tools;
use support::*;

const RATE: u64 = 10;
const INSTANCES: u64 = 3;

struct Cluster {
    proxies: Vec<ProxyProcess>,
    clients: Vec<Client>,
}

impl Cluster {
    /// Three instances: `l.test/` limited to [`RATE`] a second, `l.test/x` (answered 404 by
    /// `missing`) under `x4xx_limit: 3`.
    async fn start(redis_url: &str, ok: &Backend, missing: &Backend) -> Cluster {
        let yaml = Upstreams::new()
            .host(
                "l.test",
                Host::new()
                    .path(
                        "/",
                        Path::servers(&[ok]).rate_limit(RATE).healthcheck(false),
                    )
                    .path("/x", Path::servers(&[missing]).healthcheck(false))
                    .x4xx_limit(3),
            )
            .render();
        let main = format!(
            "limits_store: \"{redis_url}\"\ntrusted_proxies: [\"127.0.0.1/32\"]\nconfig_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\n"
        );
        let proxies: Vec<ProxyProcess> = (0..INSTANCES)
            .map(|_| ProxyProcess::start(&yaml, &main))
            .collect();
        let mut clients = Vec::new();
        for p in &proxies {
            clients.push(Client::connect(Proto::H1, p.addr).await);
        }
        Cluster { proxies, clients }
    }

    fn admin(&self, i: usize) -> SocketAddr {
        self.proxies[i].logged_addr("admin API on http://")
    }

    /// Status of a GET of `path` on instance `i` as client `ip`, and how long it took.
    async fn get(&mut self, i: usize, path: &str, ip: &str) -> (u16, Duration) {
        let started = Instant::now();
        let resp = self.clients[i]
            .send(
                Method::GET,
                Some("l.test"),
                path,
                &[("x-forwarded-for", ip)],
                full(bytes::Bytes::new()),
            )
            .await;
        let status = resp.status().as_u16();
        body_bytes(resp).await;
        (status, started.elapsed())
    }

    /// `n` requests as `ip`, spread over the instances in turn: how many were admitted, the
    /// slowest answer, and how long it all took.
    async fn spread(&mut self, ip: &str, n: usize) -> (u64, Duration, Duration) {
        let started = Instant::now();
        let (mut admitted, mut slowest) = (0, Duration::ZERO);
        for k in 0..n {
            let (status, took) = self.get(k % INSTANCES as usize, "/", ip).await;
            assert!(status == 200 || status == 429, "{status}");
            admitted += u64::from(status == 200);
            slowest = slowest.max(took);
        }
        (admitted, slowest, started.elapsed())
    }
}

/// The most a client may get in `elapsed`: its burst, what refills meanwhile, and the error
/// bound (one request per instance for limits up to 8 per second per instance).
fn allowed(elapsed: Duration) -> u64 {
    RATE + (elapsed.as_secs_f64() * RATE as f64).ceil() as u64 + INSTANCES
}

#[tokio::test]
async fn instances_share_limits_through_redis_and_fail_open_without_it() {
    let Some(program) = tools::find(&REDIS_SERVER) else {
        return;
    };
    let port = free_port();
    let redis = Redis::start(&program, port).await;
    let ok = Backend::start("ok").await;
    let missing = Backend::builder("missing").status(404).start().await;
    let mut cluster = Cluster::start(&redis.url(), &ok, &missing).await;
    // Every instance heard of the other two (heartbeats through Redis).
    for i in 0..INSTANCES as usize {
        let admin = cluster.admin(i);
        let three = eventually_async(Duration::from_secs(10), || async {
            let n = metric(admin, "aralez_limits_store_instances").await;
            (n == Some(INSTANCES as f64)).then_some(())
        });
        assert!(three.await.is_some(), "instance {i} sees three");
    }

    // 60 requests over the three instances: the limit, not three times it. (A request Redis
    // did not answer within 5 ms, on a loaded machine, is decided by its instance alone: the
    // bound grows by those.)
    let before = cluster.fell_back().await;
    let (admitted, _, elapsed) = cluster.spread("203.0.113.1", 60).await;
    let alone = cluster.fell_back().await - before;
    assert!(alone <= 5, "{alone} requests decided without Redis");
    assert!(
        (RATE..=allowed(elapsed) + alone).contains(&admitted),
        "{admitted} admitted in {elapsed:?}; {}",
        cluster.proxies[0].log_text()
    );
    // Another client has its own budget.
    for i in 0..INSTANCES as usize {
        assert_eq!(cluster.get(i, "/", "203.0.113.2").await.0, 200);
    }
    // A burst at once on one instance, over 100 connections: the limit too. The requests of one
    // instant found the room a question to Redis was about to take, and were admitted here one
    // in two (up to 2 in 5 of 100 admitted).
    let before = cluster.fell_back().await;
    let started = Instant::now();
    let addr = cluster.proxies[0].addr;
    let burst = (0..100).map(|_| async move {
        let mut c = Client::connect(Proto::H1, addr).await;
        let xff = [("x-forwarded-for", "203.0.113.9")];
        let resp = c.send(
            Method::GET,
            Some("l.test"),
            "/",
            &xff,
            full(bytes::Bytes::new()),
        );
        resp.await.status().as_u16()
    });
    let statuses = futures_util::future::join_all(burst).await;
    let elapsed = started.elapsed();
    let admitted = statuses.iter().filter(|s| **s == 200).count() as u64;
    let alone = cluster.fell_back().await - before;
    assert!(
        (RATE..=allowed(elapsed) + alone).contains(&admitted),
        "{admitted} of a burst of 100 admitted in {elapsed:?} ({alone} decided without Redis)"
    );
    let asked = metric(cluster.admin(0), "aralez_limits_store_asked_total").await;
    assert!(asked > Some(0.0), "{asked:?}");

    // x4xx_limit: 3. Three 404s over two instances (neither has three of its own) block the
    // client on the third, which never answered it a 4xx.
    for k in 0..3 {
        assert_eq!(cluster.get(k % 2, "/x/a", "203.0.113.3").await.0, 404);
    }
    assert!(
        cluster.turns(2, "/", "203.0.113.3", 429).await,
        "blocked on the third instance"
    );
    assert_eq!(
        cluster.get(2, "/", "203.0.113.4").await.0,
        200,
        "others are not"
    );

    // Redis goes away: every request is still answered, promptly, by each instance's own table.
    drop(redis);
    let (admitted, slowest, _) = cluster.spread("203.0.113.5", 30).await;
    assert!(admitted >= RATE, "{admitted}");
    assert!(slowest < Duration::from_millis(500), "{slowest:?}");
    let fell_back = metric(cluster.admin(0), "aralez_limits_store_fell_back_total").await;
    assert!(fell_back > Some(0.0), "{fell_back:?}");
    let errors = metric(cluster.admin(0), "aralez_limits_store_errors_total").await;
    assert!(errors >= Some(1.0), "{errors:?}");
    assert!(cluster.proxies[0]
        .log_text()
        .contains("limits_store: Redis unreachable"));

    // Redis is back: a new client spread over the three gets its limit again.
    let redis = Redis::start(&program, port).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut shared_again = false;
    for n in 0.. {
        if Instant::now() > deadline {
            break;
        }
        let (admitted, _, elapsed) = cluster.spread(&format!("198.51.100.{n}"), 60).await;
        if admitted <= allowed(elapsed) {
            shared_again = true;
            break;
        }
    }
    assert!(shared_again, "limits shared again after Redis came back");
    drop(redis);
}

impl Cluster {
    /// Requests the instances decided without Redis, all together.
    async fn fell_back(&self) -> u64 {
        let mut sum = 0.0;
        for i in 0..INSTANCES as usize {
            let n = metric(self.admin(i), "aralez_limits_store_fell_back_total").await;
            sum += n.unwrap_or(0.0);
        }
        sum as u64
    }

    /// Instance `i` answers `ip` with `status` within 5 s (a block travels through Redis).
    async fn turns(&mut self, i: usize, path: &str, ip: &str, status: u16) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.get(i, path, ip).await.0 == status {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}
