//! Coalescing of concurrent fetches for one key through the real binary, past its first case
//! (cache.rs): a leading client that leaves hands the fetch to one of its followers, and the
//! clients' own refreshes (`Pragma: no-cache`, a browser's reload) wait for one another too.

use crate::cache_support;
use crate::support;

use std::time::Duration;

use cache_support::*;
use http::Method;
use support::*;
use tokio::io::AsyncWriteExt;

const ADMIN: &str = "config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\n";

/// `n` clients ask for `path` at once with `headers`; their cache statuses.
fn ask_at_once(
    addr: std::net::SocketAddr,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    n: usize,
) -> tokio::task::JoinSet<String> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        tasks.spawn(async move {
            let mut c = Client::connect(Proto::H1, addr).await;
            let (resp, _) = send(&mut c, Method::GET, path, headers).await;
            hdr(&resp, "x-cache-status")
        });
    }
    tasks
}

/// The first client of a cold URL leaves before the origin answers: one of the thirty waiting
/// for its fetch fetches in its place and the others wait for that one. They all went to the
/// origin at once, so a client that asks and hangs up set off a stampede.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_leaves_hands_the_fetch_to_one_follower() {
    let origin = Origin::start().await;
    let proxy = proxy_for_with_admin(&origin);
    let admin = proxy.logged_addr("admin API on http://");
    let path = "/left?cc=max-age=60&slow=1500";
    let mut leader = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let ask = format!("GET {path} HTTP/1.1\r\nHost: c.test\r\n\r\n");
    leader.write_all(ask.as_bytes()).await.unwrap();
    assert!(eventually(Duration::from_secs(5), || origin.requests() == 1).await);
    let followers = ask_at_once(proxy.addr, path, &[], 30);
    // Every follower's connection is open (its request is read as it is accepted, and joins
    // the fetch at once) before the leader leaves.
    let open = "aralez_active_sessions";
    let mut all_in = false;
    for _ in 0..100 {
        if metric(admin, open).await >= Some(31.0) {
            all_in = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        all_in,
        "the followers' connections: {:?}",
        metric(admin, open).await
    );
    drop(leader);
    let statuses = followers.join_all().await;
    assert_eq!(
        origin.requests(),
        2,
        "the leader's fetch, then one follower's: {statuses:?}"
    );
    let misses = statuses.iter().filter(|s| *s == "MISS").count();
    assert_eq!(misses, 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| *s == "HIT").count(), 29);
}

/// Fifty reloads at once (`Pragma: no-cache`) of a stored URL make one or two origin requests:
/// the first revalidates, those that arrived before it began take what it stored, and those
/// that arrived after wait for it and then share one fetch of their own. Each was a request
/// of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refreshes_at_once_make_one_or_two_origin_requests() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let path = "/reloaded?cc=max-age=600&slow=500";
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(get(&mut c, path).await.0, "MISS");
    let statuses = ask_at_once(proxy.addr, path, &[("pragma", "no-cache")], 50)
        .join_all()
        .await;
    let fetched = origin.requests() - 1;
    assert!((1..=2).contains(&fetched), "{fetched}: {statuses:?}");
    // A refresh alone still goes to the origin.
    let (resp, _) = send(&mut c, Method::GET, path, &[("cache-control", "no-cache")]).await;
    let status = hdr(&resp, "x-cache-status");
    assert_eq!(origin.requests(), fetched + 2, "{status}");
}

/// A refresh that arrives while a fetch begun before it runs does not take that fetch's
/// answer, which may predate the change the client reloads to see: it waits for it, then
/// fetches anew (it was served the older fetch's answer as a HIT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_takes_nothing_from_a_fetch_begun_before_it() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let path = "/before?cc=max-age=600&slow=700";
    let first = fetch_under_way(&proxy, &origin, path).await;
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let (resp, body) = send(&mut c, Method::GET, path, &[("cache-control", "no-cache")]).await;
    assert_eq!(body, "#2", "{}", hdr(&resp, "x-cache-status"));
    assert_eq!(first.await.expect("the first").1, "#1");
    assert_eq!(origin.requests(), 2);
}

/// Refreshes that wait out a long fetch begun before them (4 s) share the next one: their
/// wait was counted from the first, ran out during the second, and each fetched alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refreshes_behind_a_long_fetch_share_the_next() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let path = "/long?cc=max-age=600&slow=4000";
    let first = fetch_under_way(&proxy, &origin, path).await;
    let statuses = ask_at_once(proxy.addr, path, &[("cache-control", "no-cache")], 20)
        .join_all()
        .await;
    first.await.expect("the first");
    assert_eq!(origin.requests(), 2, "{statuses:?}");
}

/// A GET of `path` through `proxy`, once the origin has it (its first request): what its
/// cache status and body are when it ends.
async fn fetch_under_way(
    proxy: &ProxyProcess,
    origin: &Origin,
    path: &'static str,
) -> tokio::task::JoinHandle<(String, String)> {
    let addr = proxy.addr;
    let fetch = tokio::spawn(async move {
        let mut c = Client::connect(Proto::H1, addr).await;
        get(&mut c, path).await
    });
    assert!(eventually(Duration::from_secs(5), || origin.requests() == 1).await);
    fetch
}

fn proxy_for_with_admin(origin: &Origin) -> ProxyProcess {
    proxy_with(origin, 16, ADMIN)
}
