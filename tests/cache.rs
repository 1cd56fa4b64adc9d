//! The response cache (main.yaml's `cache:`) through the real binary, against an origin that
//! counts its requests: a count that does not move proves a hit. Freshness from the response,
//! the default `ttl`, what is never stored, `Vary`, `Age`, the request's own `Cache-Control`,
//! invalidation by unsafe methods, `cache: false` and `cache_ttl` routes, bodies past
//! `item_max_size`, coalescing of concurrent misses, HEAD from a stored GET, revalidation,
//! stale answers, ranges, purge, metrics and the disk tier, over HTTP/1.1 and h2c.

use crate::cache_support;
use crate::support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use cache_support::*;
use http::Method;
use support::*;

#[tokio::test]
async fn fresh_answers_are_served_from_the_cache_with_their_age() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        let path = format!("/fresh-{proto:?}?cc=max-age=60");
        assert_eq!(get(&mut c, &path).await.0, "MISS");
        let before = origin.requests();
        let (resp, body) = send(&mut c, Method::GET, &path, &[]).await;
        assert_eq!(hdr(&resp, "x-cache-status"), "HIT", "{proto:?}");
        assert_eq!(origin.requests(), before, "a hit never reaches the origin");
        assert!(body.starts_with('#'), "{body}");
        let age: u64 = hdr(&resp, "age").parse().expect("an Age header");
        assert!(age <= 2, "{age}");
        // HEAD is answered from the stored GET, without a body.
        let (head, body) = send(&mut c, Method::HEAD, &path, &[]).await;
        assert_eq!(
            (hdr(&head, "x-cache-status").as_str(), body.as_str()),
            ("HIT", "")
        );
        assert_eq!(origin.requests(), before);
    }
    // The origin's own Age counts toward the entry's age.
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    get(&mut c, "/aged?cc=max-age=600&age=100").await;
    let (resp, _) = send(&mut c, Method::GET, "/aged?cc=max-age=600&age=100", &[]).await;
    let age: u64 = hdr(&resp, "age").parse().expect("an Age header");
    assert!((100..=102).contains(&age), "{age}");
}

/// Answers without a body (a 204, a 200 or a redirect of `Content-Length: 0`) are kept like
/// any other: their writer never polls a body that says it has ended, so the copy was never
/// made and each one went to the origin.
#[tokio::test]
async fn answers_without_a_body_are_kept_too() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        for status in [204, 200, 301] {
            let path = format!("/empty-{proto:?}-{status}?cc=max-age=60&status={status}&len=0");
            let (first, body) = send(&mut c, Method::GET, &path, &[]).await;
            assert_eq!(hdr(&first, "x-cache-status"), "MISS", "{proto:?} {status}");
            assert_eq!((first.status().as_u16(), body.as_str()), (status, ""));
            let before = origin.requests();
            let (again, body) = send(&mut c, Method::GET, &path, &[]).await;
            assert_eq!(hdr(&again, "x-cache-status"), "HIT", "{proto:?} {status}");
            assert_eq!((again.status().as_u16(), body.as_str()), (status, ""));
            assert_eq!(origin.requests(), before, "{proto:?} {status}");
        }
    }
}

/// A GET with a body, or one that a framework takes for another method
/// (`X-HTTP-Method-Override`), is neither answered from the cache nor kept for the URL: what
/// the backend makes of it is not in the key, and its answer was served to every later client.
#[tokio::test]
async fn a_get_with_a_body_or_another_method_in_disguise_bypasses_the_cache() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        let path = format!("/disguised-{proto:?}?cc=max-age=60");
        let resp = c
            .send(Method::GET, Some("c.test"), &path, &[], full("x=evil"))
            .await;
        assert_eq!(header(&resp, "x-cache-status"), "BYPASS", "{proto:?}");
        body_bytes(resp).await;
        assert_eq!(
            get(&mut c, &path).await.0,
            "MISS",
            "{proto:?}: nothing was kept"
        );
        assert_eq!(get(&mut c, &path).await.0, "HIT", "{proto:?}");
        // `Content-Length: 0` says there is none, whatever frames follow the head (over HTTP/2,
        // an empty DATA frame that ends the stream after it: that was a BYPASS).
        let empty_frame = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
            hyper::body::Frame::data(bytes::Bytes::new()),
        )]);
        let body = http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(empty_frame));
        let resp = c
            .send(
                Method::GET,
                Some("c.test"),
                &path,
                &[("content-length", "0")],
                body,
            )
            .await;
        assert_eq!(header(&resp, "x-cache-status"), "HIT", "{proto:?}");
        body_bytes(resp).await;
        let before = origin.requests();
        let (resp, _) = send(
            &mut c,
            Method::GET,
            &path,
            &[("x-http-method-override", "DELETE")],
        )
        .await;
        assert_eq!(hdr(&resp, "x-cache-status"), "BYPASS", "{proto:?}");
        assert_eq!(
            origin.requests(),
            before + 1,
            "{proto:?}: it reached the origin"
        );
    }
}

#[tokio::test]
async fn what_may_not_be_stored_always_reaches_the_origin() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    for path in [
        "/a?cc=no-store",
        "/b?cc=private,+max-age=60",
        "/c?cc=no-cache",
        "/d?cc=max-age=60&cookie=s=1",
        "/e?cc=max-age=60&vary=*",
        "/f?status=500&cc=max-age=60",
        "/g?status=410",
        "/h?cc=max-age=5&age=9",
    ] {
        let before = origin.requests();
        assert_eq!(get(&mut c, path).await.0, "MISS", "{path}");
        assert_eq!(get(&mut c, path).await.0, "MISS", "{path}");
        assert_eq!(origin.requests(), before + 2, "{path}");
    }
    // Without freshness of its own, a 200 or 404 gets the configured ttl; a redirect with a
    // lifetime of its own is kept for it.
    for path in [
        "/plain",
        "/missing?status=404",
        "/moved?status=302&cc=max-age=60",
        "/moved?status=307&cc=max-age=60",
    ] {
        get(&mut c, path).await;
        assert_eq!(get(&mut c, path).await.0, "HIT", "{path}");
    }
    // A body past item_max_size (1 MB) streams whole and is not kept.
    let big = "/big?cc=max-age=60&len=1500000";
    for _ in 0..2 {
        let (resp, body) = send(&mut c, Method::GET, big, &[]).await;
        assert_eq!(
            (hdr(&resp, "x-cache-status").as_str(), body.len()),
            ("MISS", 1_500_000)
        );
    }
    let (resp, body) = send(&mut c, Method::GET, "/small?cc=max-age=60&len=900000", &[]).await;
    assert_eq!(hdr(&resp, "x-cache-status"), "MISS");
    assert_eq!(body.len(), 900_000);
    assert_eq!(
        get(&mut c, "/small?cc=max-age=60&len=900000").await.0,
        "HIT"
    );
}

#[tokio::test]
async fn vary_keeps_one_answer_per_variant() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H2c, proxy.addr).await;
    let path = "/v?cc=max-age=60&vary=Accept-Language";
    let lang = |l: &'static str| [("accept-language", l)];
    let (fr, _) = send(&mut c, Method::GET, path, &lang("fr")).await;
    let (de, _) = send(&mut c, Method::GET, path, &lang("de")).await;
    assert_eq!(
        (hdr(&fr, "x-cache-status"), hdr(&de, "x-cache-status")),
        ("MISS".into(), "MISS".into())
    );
    let before = origin.requests();
    for l in ["fr", "de"] {
        let (resp, _) = send(&mut c, Method::GET, path, &lang(l)).await;
        assert_eq!(hdr(&resp, "x-cache-status"), "HIT");
        assert_eq!(
            hdr(&resp, "x-lang"),
            l,
            "each variant answers its own language"
        );
    }
    assert_eq!(origin.requests(), before);
    // Headers Vary does not name (X-Forwarded-Host, ...) are not part of the key and cannot
    // replace what is stored.
    let (resp, _) = send(
        &mut c,
        Method::GET,
        path,
        &[("accept-language", "fr"), ("x-forwarded-host", "evil.test")],
    )
    .await;
    assert_eq!(hdr(&resp, "x-cache-status"), "HIT");
    assert_eq!(hdr(&resp, "x-lang"), "fr");
}

#[tokio::test]
async fn the_client_and_unsafe_methods_can_refresh_the_cache() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let path = "/r?cc=max-age=60";
    let (_, first) = get(&mut c, path).await;
    // `Cache-Control: no-cache` from the client: fetched again (no validator to ask with), and
    // the new answer stored.
    let (resp, second) = send(&mut c, Method::GET, path, &[("cache-control", "no-cache")]).await;
    assert_eq!(hdr(&resp, "x-cache-status"), "EXPIRED");
    assert_ne!(first, second);
    assert_eq!(get(&mut c, path).await, ("HIT".to_string(), second.clone()));
    // With a validator it is a revalidation (SPEC §14; a browser's reload sends `max-age=0`):
    // the backend's 304 renews the stored answer, which the client gets whole.
    let tagged = "/r?cc=max-age=60&etag=t1";
    let (_, stored) = get(&mut c, tagged).await;
    for asked in ["no-cache", "max-age=0"] {
        let before = origin.requests();
        let (resp, body) = send(&mut c, Method::GET, tagged, &[("cache-control", asked)]).await;
        assert_eq!(hdr(&resp, "x-cache-status"), "REVALIDATED", "{asked}");
        assert_eq!(
            (resp.status().as_u16(), body.as_str()),
            (200, stored.as_str())
        );
        assert_eq!(origin.requests(), before + 1, "{asked}: asked the origin");
    }
    // `no-store` from the client: not served from the cache.
    let (resp, _) = send(&mut c, Method::GET, path, &[("cache-control", "no-store")]).await;
    assert_eq!(hdr(&resp, "x-cache-status"), "BYPASS");
    // A POST the backend refuses changed nothing there: what is stored stays (RFC 9111 §4.4; it
    // was dropped on the POST's arrival, so any request could evict entries).
    origin.failing.store(true, Ordering::SeqCst);
    let (resp, _) = send(&mut c, Method::POST, path, &[]).await;
    assert_eq!(resp.status(), 503);
    origin.failing.store(false, Ordering::SeqCst);
    assert_eq!(get(&mut c, path).await.0, "HIT");
    // A POST it takes drops what is stored for the URL.
    send(&mut c, Method::POST, path, &[]).await;
    assert_eq!(get(&mut c, path).await.0, "MISS");
}

#[tokio::test]
async fn routes_choose_their_ttl_or_no_cache() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    // `cache: false`: never cached, no status header.
    for _ in 0..2 {
        let (resp, _) = send(&mut c, Method::GET, "/off?cc=max-age=60", &[]).await;
        assert_eq!(hdr(&resp, "x-cache-status"), "");
    }
    // An authorization policy keeps the route out of the cache.
    let creds = [("authorization", "Basic dXNlcjpwYXNz")];
    for _ in 0..2 {
        let (resp, _) = send(&mut c, Method::GET, "/auth?cc=public,+max-age=60", &creds).await;
        assert_eq!(
            (resp.status().as_u16(), hdr(&resp, "x-cache-status")),
            (200, String::new())
        );
    }
    // `cache_ttl: 1` on /short: the answer without freshness expires after a second.
    get(&mut c, "/short").await;
    assert_eq!(get(&mut c, "/short").await.0, "HIT");
    // Real time is the point here: the entry must age past its one-second ttl.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(get(&mut c, "/short").await.0, "EXPIRED");
    assert_eq!(get(&mut c, "/short").await.0, "HIT");
}

#[tokio::test]
async fn concurrent_misses_make_one_origin_request() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let path = "/slow?cc=max-age=60&slow=300";
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let addr = proxy.addr;
        let proto = if i % 2 == 0 { Proto::H1 } else { Proto::H2c };
        tasks.spawn(async move {
            let mut c = Client::connect(proto, addr).await;
            get(&mut c, path).await
        });
    }
    let mut bodies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        bodies.push(done.expect("request task").1);
    }
    assert_eq!(
        origin.requests(),
        1,
        "100 concurrent misses, one origin request"
    );
    assert!(bodies.iter().all(|b| b == "#1"), "{bodies:?}");
}

/// Forty clients at once ask for `path` through `proxy`, each with one of `langs` in turn as
/// its `Accept-Language`; each gets the variant it asked for.
async fn ask_in_every_language(
    proxy: &ProxyProcess,
    path: &'static str,
    langs: &'static [&'static str],
) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let addr = proxy.addr;
        let lang = langs[i % langs.len()];
        tasks.spawn(async move {
            let mut c = Client::connect(Proto::H1, addr).await;
            let (resp, _) = send(&mut c, Method::GET, path, &[("accept-language", lang)]).await;
            (lang, hdr(&resp, "x-lang"))
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (asked, answered) = done.expect("request task");
        assert_eq!(asked, answered, "each client gets its own variant");
    }
}

/// Concurrent misses of two variants of one cold URL make one origin request each: the clients
/// of the variant not fetched first all went to the origin once the first was in.
#[tokio::test]
async fn concurrent_misses_of_two_variants_make_one_origin_request_each() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let path = "/slow-varied?cc=max-age=60&slow=300&vary=accept-language";
    ask_in_every_language(&proxy, path, &["en", "fr"]).await;
    assert_eq!(origin.requests(), 2, "40 concurrent misses of two variants");
    // Once the URL is known to vary, each variant's misses wait on that variant's fetch alone:
    // four new variants are fetched at once, not one after the other.
    ask_in_every_language(&proxy, path, &["de", "es", "it", "nl"]).await;
    assert_eq!(origin.requests(), 6, "one origin request a variant");
    assert_eq!(
        origin.seen.most_at_once(),
        4,
        "the four variants fetched at once"
    );
}

#[tokio::test]
async fn stale_entries_are_revalidated_and_a_304_refreshes_them() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    // Stale on arrival (Age = max-age) but it has a validator: kept, and asked about next time.
    let path = "/rv?cc=max-age=60&age=60&etag=v1";
    assert_eq!(
        get(&mut c, path).await,
        ("MISS".to_string(), "#1".to_string())
    );
    assert_eq!(
        get(&mut c, path).await,
        ("REVALIDATED".to_string(), "#1".to_string())
    );
    assert_eq!(origin.requests(), 2, "the revalidation reached the origin");
    // The 304 (no Age) made it fresh for 60 s.
    assert_eq!(
        get(&mut c, path).await,
        ("HIT".to_string(), "#1".to_string())
    );
    assert_eq!(origin.requests(), 2);
    // A 304 that names another representation (a strong ETag of its own) updates nothing
    // (RFC 9111 §4.3.4): the stale copy is served as such this once, and the entry goes.
    let path = "/mm?cc=max-age=60&age=60&etag=v1&etag304=v9";
    assert_eq!(get(&mut c, path).await.0, "MISS");
    let (resp, body) = send(&mut c, Method::GET, path, &[]).await;
    assert_eq!(
        (
            hdr(&resp, "x-cache-status"),
            hdr(&resp, "etag"),
            body.as_str()
        ),
        ("STALE".into(), "\"v1\"".into(), "#3")
    );
    assert_eq!(
        get(&mut c, path).await,
        ("MISS".to_string(), "#5".to_string())
    );
    // `no-cache` answers with a validator are kept and revalidated on every use.
    let path = "/nc?cc=no-cache&etag=v2";
    get(&mut c, path).await;
    for n in 0..2 {
        assert_eq!(get(&mut c, path).await.0, "REVALIDATED");
        assert_eq!(origin.requests(), 7 + n);
    }
}

#[tokio::test]
async fn clients_validators_and_ranges_are_answered_from_the_cache() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H2c, proxy.addr).await;
    let path = "/obj?cc=max-age=60&etag=v3&len=100";
    get(&mut c, path).await;
    let (resp, body) = send(&mut c, Method::GET, path, &[("if-none-match", "\"v3\"")]).await;
    assert_eq!((resp.status().as_u16(), body.as_str()), (304, ""));
    assert_eq!(hdr(&resp, "x-cache-status"), "HIT");
    let (resp, body) = send(&mut c, Method::GET, path, &[("if-none-match", "\"other\"")]).await;
    assert_eq!((resp.status().as_u16(), body.len()), (200, 100));
    let (resp, body) = send(&mut c, Method::GET, path, &[("range", "bytes=10-19")]).await;
    assert_eq!((resp.status().as_u16(), body.as_str()), (206, "cccccccccc"));
    assert_eq!(hdr(&resp, "content-range"), "bytes 10-19/100");
    let (resp, _) = send(&mut c, Method::GET, path, &[("range", "bytes=-5")]).await;
    assert_eq!(hdr(&resp, "content-range"), "bytes 95-99/100");
    // The unit in any case (RFC 9110 §14.1).
    let (resp, _) = send(&mut c, Method::GET, path, &[("range", "BYTES=2-4")]).await;
    assert_eq!(hdr(&resp, "content-range"), "bytes 2-4/100");
    let (resp, body) = send(&mut c, Method::GET, path, &[("range", "items=2-4")]).await;
    assert_eq!((resp.status().as_u16(), body.len()), (200, 100));
    let (resp, _) = send(&mut c, Method::GET, path, &[("range", "bytes=200-")]).await;
    assert_eq!(
        (resp.status().as_u16(), hdr(&resp, "content-range")),
        (416, "bytes */100".into())
    );
    // If-Range with another validator: the whole object.
    let stale_copy = [("range", "bytes=0-9"), ("if-range", "\"v0\"")];
    let (resp, body) = send(&mut c, Method::GET, path, &stale_copy).await;
    assert_eq!((resp.status().as_u16(), body.len()), (200, 100));
    assert_eq!(origin.requests(), 1, "every answer came from the cache");
    // A client's validators on a miss: the whole answer is fetched and kept, and the client's
    // 304 made from it. Forwarded, they made the origin answer 304, which cannot be kept, so a
    // URL asked by revalidating clients never entered the cache.
    let path = "/cond?cc=max-age=60&etag=v9&len=10";
    let (resp, body) = send(&mut c, Method::GET, path, &[("if-none-match", "\"v9\"")]).await;
    assert_eq!((resp.status().as_u16(), body.as_str()), (304, ""));
    assert_eq!(hdr(&resp, "x-cache-status"), "MISS");
    assert_eq!(hdr(&resp, "etag"), "\"v9\"");
    assert_eq!(get(&mut c, path).await, ("HIT".into(), "c".repeat(10)));
    let (resp, body) = send(
        &mut c,
        Method::GET,
        "/cond?cc=max-age=60&etag=v8&len=10",
        &[("if-none-match", "\"v9\"")],
    )
    .await;
    assert_eq!(
        (resp.status().as_u16(), body.len()),
        (200, 10),
        "another tag: the whole answer"
    );
    assert_eq!(origin.requests(), 3);
}

#[tokio::test]
async fn stale_answers_while_updating_and_when_the_origin_fails() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    // stale-while-revalidate: one request refreshes (slowly), the others get the stale copy.
    let path = "/swr?cc=max-age=5,+stale-while-revalidate=60&age=5&slow=400";
    assert_eq!(get(&mut c, path).await.0, "MISS");
    let proxy_addr = proxy.addr;
    let refresh = tokio::spawn(async move {
        let mut c = Client::connect(Proto::H1, proxy_addr).await;
        get(&mut c, path).await
    });
    assert!(eventually(Duration::from_secs(5), || origin.requests() == 2).await);
    let (word, body) = get(&mut c, path).await;
    assert_eq!((word.as_str(), body.as_str()), ("UPDATING", "#1"));
    assert_eq!(
        refresh.await.expect("refresh"),
        ("EXPIRED".to_string(), "#2".to_string())
    );
    // stale-if-error: served while the origin fails, within its allowance.
    let path = "/sie?cc=max-age=5,+stale-if-error=60&age=5";
    assert_eq!(get(&mut c, path).await.0, "MISS");
    origin.failing.store(true, Ordering::SeqCst);
    let (resp, body) = send(&mut c, Method::GET, path, &[]).await;
    assert_eq!(
        (resp.status().as_u16(), hdr(&resp, "x-cache-status"), body),
        (200, "STALE".into(), "#3".into())
    );
    // Without an allowance (or with must-revalidate) the failure reaches the client.
    let path = "/strict?cc=max-age=5,+must-revalidate,+stale-if-error=60&age=5&etag=s";
    origin.failing.store(false, Ordering::SeqCst);
    get(&mut c, path).await;
    origin.failing.store(true, Ordering::SeqCst);
    let (resp, _) = send(&mut c, Method::GET, path, &[]).await;
    assert_eq!(
        (resp.status().as_u16(), hdr(&resp, "x-cache-status")),
        (503, "EXPIRED".into())
    );
}

/// The files of the disk tier in `dir` and their total size.
fn files_in(dir: &std::path::Path) -> (Vec<std::path::PathBuf>, u64) {
    let mut files = Vec::new();
    let mut total = 0;
    for item in std::fs::read_dir(dir).expect("cache dir").flatten() {
        total += item.metadata().map(|m| m.len()).unwrap_or(0);
        files.push(item.path());
    }
    (files, total)
}

#[tokio::test]
async fn hybrid_keeps_answers_across_a_restart_and_refuses_broken_files() {
    let origin = Origin::start().await;
    let dir = tempfile::tempdir().expect("cache dir");
    let cache = format!(
        "  storage: hybrid\n  file_path: \"{}\"\n  ttl: 60\n",
        dir.path().display()
    );
    let path = "/d?cc=max-age=600";
    let mut first = proxy_cache(&origin, &cache, "");
    let mut c = Client::connect(Proto::H1, first.addr).await;
    assert_eq!(
        get(&mut c, path).await,
        ("MISS".to_string(), "#1".to_string())
    );
    assert!(eventually(Duration::from_secs(5), || files_in(dir.path()).0.len() == 1).await);
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(first
        .wait_exit(Duration::from_secs(20))
        .is_some_and(|s| s.success()));

    let second = proxy_cache(&origin, &cache, ADMIN);
    let mut c = Client::connect(Proto::H2c, second.addr).await;
    let (resp, body) = send(&mut c, Method::GET, path, &[]).await;
    assert_eq!(
        (hdr(&resp, "x-cache-status").as_str(), body.as_str()),
        ("HIT", "#1")
    );
    let age: u64 = hdr(&resp, "age").parse().expect("Age");
    assert!(age < 60, "{age}");
    assert_eq!(
        origin.requests(),
        1,
        "served from the file after the restart"
    );
    let admin = second.logged_addr("admin API on http://");
    let read_back = metric(admin, "aralez_cache_hits_total{tier=\"disk\"}").await;
    assert_eq!(read_back, Some(1.0));
    drop(second);

    // A file cut short is a miss, and is removed when the next run reads the directory.
    let (files, _) = files_in(dir.path());
    let bytes = std::fs::read(&files[0]).expect("read");
    std::fs::write(&files[0], &bytes[..bytes.len() - 10]).expect("truncate");
    let third = proxy_cache(&origin, &cache, "");
    let mut c = Client::connect(Proto::H1, third.addr).await;
    assert_eq!(
        get(&mut c, path).await,
        ("MISS".to_string(), "#2".to_string())
    );
    assert!(third
        .log_text()
        .contains("cache: removing a broken or unfinished file"));
}

#[tokio::test]
async fn the_disk_tier_stays_within_file_size_mb() {
    let origin = Origin::start().await;
    let dir = tempfile::tempdir().expect("cache dir");
    let cache = format!(
        "  storage: hybrid\n  file_path: \"{}\"\n  file_size_mb: 1\n  item_max_size: 1\n",
        dir.path().display()
    );
    let proxy = proxy_cache(&origin, &cache, ADMIN);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    for i in 0..30 {
        get(&mut c, &format!("/f/{i}?cc=max-age=600&len=100000")).await;
    }
    // Writes are queued off the request path: wait for the newest to land.
    let newest_written = || files_in(dir.path()).0.len() >= 9;
    assert!(eventually(Duration::from_secs(5), newest_written).await);
    let (files, total) = files_in(dir.path());
    assert!(total <= 1024 * 1024, "{} files, {total} bytes", files.len());
    assert!(files.len() >= 9, "{}", files.len());
    let admin = proxy.logged_addr("admin API on http://");
    let evicted = metric(admin, "aralez_cache_evictions_total{tier=\"disk\"}").await;
    assert!(evicted >= Some(20.0), "{evicted:?}");
    let held = metric(admin, "aralez_cache_bytes{tier=\"disk\"}").await;
    assert!(
        held <= Some(1024.0 * 1024.0) && held > Some(0.0),
        "{held:?}"
    );
}

const ADMIN: &str = "config_address: \"127.0.0.1:0\"\nmaster_key: \"k\"\n";

#[tokio::test]
async fn purge_by_url_or_prefix_and_the_metrics() {
    let origin = Origin::start().await;
    let proxy = proxy_with(&origin, 16, ADMIN);
    let admin = proxy.logged_addr("admin API on http://");
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let lang = |l: &'static str| [("accept-language", l)];
    let a = "/p/a?cc=max-age=60&vary=Accept-Language";
    for path in [
        "/p/b?cc=max-age=60",
        "/pq?cc=max-age=60",
        "/q/c?cc=max-age=60",
    ] {
        get(&mut c, path).await;
    }
    for l in ["fr", "de"] {
        send(&mut c, Method::GET, a, &lang(l)).await;
    }
    assert_eq!(
        purge(admin, "wrong", "{\"url\": \"http://c.test/p/a\"}")
            .await
            .0,
        403
    );
    let url = format!("{{\"url\": \"http://C.test:80{a}\"}}");
    assert_eq!(
        purge(admin, "k", &url).await,
        (200, "{\"purged\":2}".to_string())
    );
    let (resp, _) = send(&mut c, Method::GET, a, &lang("fr")).await;
    assert_eq!(hdr(&resp, "x-cache-status"), "MISS");
    // A prefix takes whole segments: /pq stays, /p/a (stored again) and /p/b go.
    let prefix = "{\"host\": \"c.test\", \"prefix\": \"/p\"}";
    assert_eq!(
        purge(admin, "k", prefix).await,
        (200, "{\"purged\":2}".to_string())
    );
    assert_eq!(get(&mut c, "/p/b?cc=max-age=60").await.0, "MISS");
    assert_eq!(get(&mut c, "/pq?cc=max-age=60").await.0, "HIT");
    assert_eq!(get(&mut c, "/q/c?cc=max-age=60").await.0, "HIT");
    assert_eq!(purge(admin, "k", "{\"nope\": 1}").await.0, 400);
    let series = |name: &str| format!("aralez_cache_{name}{{tier=\"memory\"}}");
    assert_eq!(metric(admin, &series("hits_total")).await, Some(2.0));
    assert_eq!(metric(admin, &series("purged_total")).await, Some(4.0));
    assert!(metric(admin, &series("misses_total")).await >= Some(7.0));
    assert!(metric(admin, &series("bytes")).await > Some(0.0));
}

#[tokio::test]
async fn memory_stays_within_mem_size_mb_under_ten_times_the_working_set() {
    let origin = Origin::start().await;
    let proxy = proxy_with(&origin, 2, ADMIN);
    let admin = proxy.logged_addr("admin API on http://");
    let mut c = Client::connect(Proto::H2c, proxy.addr).await;
    let rss_before = proxy.rss_kib();
    // 200 answers of 100 KB: 20 MB through a 2 MB cache.
    for i in 0..200 {
        let (resp, body) = send(
            &mut c,
            Method::GET,
            &format!("/w/{i}?cc=max-age=60&len=100000"),
            &[],
        )
        .await;
        assert_eq!(
            (hdr(&resp, "x-cache-status").as_str(), body.len()),
            ("MISS", 100_000)
        );
    }
    let held = metric(admin, "aralez_cache_bytes{tier=\"memory\"}")
        .await
        .expect("bytes");
    let evicted = metric(admin, "aralez_cache_evictions_total{tier=\"memory\"}")
        .await
        .expect("evictions");
    assert!(held <= 2.0 * 1024.0 * 1024.0, "{held}");
    assert!(evicted >= 150.0, "{evicted}");
    // The most recent answers are still there.
    assert_eq!(
        get(&mut c, "/w/199?cc=max-age=60&len=100000").await.0,
        "HIT"
    );
    println!(
        "cache held {held} bytes, {evicted} evicted; RSS {rss_before} -> {} KiB",
        proxy.rss_kib()
    );
}

/// An answer up to `item_max_size` is kept even in a small tier: its capacity was split in
/// shards (eight here) and each refused what was over its share, 512 KB of 4 MB.
#[tokio::test]
async fn an_answer_up_to_item_max_size_is_kept_in_a_small_tier() {
    let origin = Origin::start().await;
    let cache = "  storage: memory\n  mem_size_mb: 4\n  item_max_size: 3\n  ttl: 60\n";
    let proxy = proxy_cache(&origin, cache, "");
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    for len in [700_000, 2_500_000] {
        let path = format!("/big/{len}?cc=max-age=60&len={len}");
        assert_eq!(get(&mut c, &path).await.0, "MISS", "{len}");
        assert_eq!(get(&mut c, &path).await.0, "HIT", "{len}");
    }
}

#[test]
fn check_config_names_the_line_of_a_bad_cache_value() {
    let dir = tempfile::tempdir().expect("temp dir");
    let main = dir.path().join("main.yaml");
    std::fs::write(dir.path().join("upstreams.yaml"), "upstreams: {}\n").expect("write");
    std::fs::write(
        &main,
        "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \"upstreams.yaml\"\ncache:\n  storage: memory\n  mem_size_mb: lots\n",
    )
    .expect("write");
    let out = std::process::Command::new(binary())
        .args(["check-config", "-c"])
        .arg(&main)
        .output()
        .expect("run check-config");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("main.yaml:5:") && text.contains("cache.mem_size_mb"),
        "{text}"
    );
}

/// The host as the client wrote it reaches the backend (`Host`, `X-Forwarded-Host`), which may
/// build links from it: an entry fetched for `c.test:1337` or `C.TEST.` was served to every
/// client of `c.test`. Each spelling now has its own entry; the routed one stays purgeable.
#[tokio::test]
async fn a_host_spelled_otherwise_cannot_poison_the_routed_hosts_entry() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        let path = format!("/spelled-{proto:?}?cc=max-age=60");
        for (host, want) in [
            ("c.test:1337", "MISS"),
            ("c.test", "MISS"),
            ("c.test", "HIT"),
            ("C.TEST", "MISS"),
            ("c.test:1337", "HIT"),
        ] {
            let resp = c
                .send(
                    Method::GET,
                    Some(host),
                    &path,
                    &[],
                    full(bytes::Bytes::new()),
                )
                .await;
            let status = resp.headers().get("x-cache-status").cloned();
            body_bytes(resp).await;
            let status = status.map(|v| v.to_str().unwrap_or("?").to_string());
            assert_eq!(status.as_deref(), Some(want), "{proto:?} {host}");
        }
    }
}

#[tokio::test]
async fn event_streams_are_neither_stored_nor_coalesced() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let path = "/events?cc=max-age=60&ct=text/event-stream&slow=300";
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let addr = proxy.addr;
        tasks.spawn(async move {
            let mut c = Client::connect(Proto::H1, addr).await;
            let started = std::time::Instant::now();
            let got = get(&mut c, path).await;
            (got, started.elapsed())
        });
    }
    while let Some(done) = tasks.join_next().await {
        let ((word, _), took) = done.expect("request task");
        assert_eq!(word, "MISS");
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }
    assert_eq!(origin.requests(), 2, "each subscriber asks the origin");
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(
        get(&mut c, path).await.0,
        "MISS",
        "never replayed from the cache"
    );
    assert_eq!(origin.requests(), 3);
}

#[tokio::test]
async fn a_slow_reader_of_a_large_answer_does_not_hold_up_the_next_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = Origin::start().await;
    let cache = "  storage: memory\n  mem_size_mb: 64\n  item_max_size: 16\n  ttl: 60\n";
    let proxy = proxy_cache(&origin, cache, "");
    let path = "/large?cc=max-age=60&len=12000000";
    // The first client reads the head and a little, then stops: the proxy can write the rest
    // only as fast as it reads, so the copy for the cache fills no faster.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut slow = socket.connect(proxy.addr).await.unwrap();
    let ask = format!("GET {path} HTTP/1.1\r\nhost: c.test\r\n\r\n");
    slow.write_all(ask.as_bytes()).await.unwrap();
    let mut first = [0u8; 1024];
    let n = slow.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let started = std::time::Instant::now();
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let (resp, body) = send(&mut c, Method::GET, path, &[]).await;
    let took = started.elapsed();
    assert_eq!(resp.status(), 200);
    assert_eq!(body.len(), 12_000_000);
    assert!(
        took < Duration::from_millis(2500),
        "the second request took {took:?}"
    );
    assert_eq!(origin.requests(), 2);
    drop(slow);
}

/// A URL purge takes the entries of every spelling of its host that clients wrote (a port,
/// capitals, a trailing dot: each has an entry of its own, as the backend may build links from
/// it). It took only the routed spelling's and answered success, and the others were served
/// stale until their lifetime ended.
#[tokio::test]
async fn purging_a_url_takes_every_spelling_of_its_host() {
    let origin = Origin::start().await;
    let proxy = proxy_with(&origin, 16, ADMIN);
    let admin = proxy.logged_addr("admin API on http://");
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let path = "/s?cc=max-age=60";
    let spellings = ["c.test", "c.test:8080", "C.TEST", "c.test."];
    for host in spellings {
        for expected in ["MISS", "HIT"] {
            assert_eq!(
                cache_status_on(&mut c, host, path).await,
                expected,
                "{host}"
            );
        }
    }
    let url = format!("{{\"url\": \"http://c.test{path}\"}}");
    assert_eq!(
        purge(admin, "k", &url).await,
        (200, "{\"purged\":4}".to_string())
    );
    for host in spellings {
        let status = cache_status_on(&mut c, host, path).await;
        assert_eq!(status, "MISS", "{host} was left");
    }
}

/// `X-Cache-Status` of a GET of `path` with `host` written as given.
async fn cache_status_on(c: &mut Client, host: &str, path: &str) -> String {
    let resp = c.get(host, path).await;
    let status = header(&resp, "x-cache-status");
    body_bytes(resp).await;
    status
}

/// The access log says what the cache did (`cache=`, nginx's `$upstream_cache_status`): a
/// miss, then a hit, and `-` on a route the cache leaves alone.
#[tokio::test]
async fn the_access_log_says_what_the_cache_did() {
    let origin = Origin::start().await;
    let proxy = proxy_with(&origin, 16, "access_log: all\n");
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    for path in ["/logged?cc=max-age=60", "/logged?cc=max-age=60", "/off"] {
        get(&mut c, path).await;
    }
    assert!(
        proxy
            .wait_log_count("access ", 3, Duration::from_secs(10))
            .await
    );
    let log = proxy.log_text();
    let caches: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("access "))
        .filter_map(|l| l.split(" cache=").nth(1)?.split(' ').next())
        .collect();
    assert_eq!(caches, ["MISS", "HIT", "-"], "{log}");
}
