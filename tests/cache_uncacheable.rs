//! The cache's answers that cannot be stored, and HEAD misses, through the real binary: a key
//! whose answer could not be stored is marked, so that its requests go to the origin side by
//! side instead of queueing behind one another (Varnish's "hit-for-miss"); the mark gives way
//! when the answer becomes storable (and a 304 to the client's own validator sets none); a HEAD that misses is asked as a GET and its answer kept
//! (nginx's `proxy_cache_convert_head`).

use crate::cache_support;
use crate::support;

use std::sync::atomic::Ordering;

use cache_support::*;
use http::Method;
use support::*;

#[tokio::test]
async fn requests_for_an_uncacheable_answer_are_not_queued_behind_each_other() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let path = "/u?cc=no-store&slow=2000";
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    assert_eq!(get(&mut c, path).await.0, "MISS");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..10 {
        let addr = proxy.addr;
        let proto = if i % 2 == 0 { Proto::H1 } else { Proto::H2c };
        tasks.spawn(async move {
            let mut c = Client::connect(proto, addr).await;
            get(&mut c, path).await.0
        });
    }
    while let Some(done) = tasks.join_next().await {
        assert_eq!(done.expect("request task"), "MISS");
    }
    assert_eq!(origin.requests(), 11);
    // Coalesced, the ten would have reached the origin one, then nine.
    assert_eq!(origin.seen.most_at_once(), 10, "all ten at once");
}

#[tokio::test]
async fn a_304_to_the_clients_own_validator_does_not_mark_the_key() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let path = "/e?cc=max-age=60&etag=v1&slow=500";
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let (resp, _) = send(&mut c, Method::GET, path, &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(resp.status(), 304);
    // The validator was the client's to be answered here: the origin was asked for the whole
    // answer, which is kept, and later clients are served from it.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let addr = proxy.addr;
        tasks.spawn(async move {
            let mut c = Client::connect(Proto::H1, addr).await;
            get(&mut c, path).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        assert_eq!(done.expect("request task"), ("HIT".into(), "#1".into()));
    }
    assert_eq!(origin.requests(), 1);
}

#[tokio::test]
async fn a_key_whose_answer_becomes_storable_is_cached_again() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    for path in ["/t?flip=1", "/tv?flip=1&vary=Accept-Language"] {
        assert_eq!(get(&mut c, path).await.0, "MISS", "{path}");
        assert_eq!(get(&mut c, path).await.0, "MISS", "{path}");
    }
    origin.flipped.store(true, Ordering::SeqCst);
    let before = origin.requests();
    // Without Vary, the first storable answer is kept.
    assert_eq!(
        get(&mut c, "/t?flip=1").await,
        ("MISS".into(), format!("#{}", before + 1))
    );
    assert_eq!(get(&mut c, "/t?flip=1").await.0, "HIT");
    // With Vary, the request's headers were not copied under the mark: the next one is kept.
    let tv = "/tv?flip=1&vary=Accept-Language";
    let en = [("accept-language", "en")];
    for want in ["MISS", "MISS", "HIT"] {
        let (resp, _) = send(&mut c, Method::GET, tv, &en).await;
        assert_eq!(hdr(&resp, "x-cache-status"), want);
    }
    assert_eq!(origin.requests(), before + 3);
}

#[tokio::test]
async fn a_head_that_misses_is_asked_as_a_get_and_its_answer_kept() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    for proto in PROTOCOLS {
        let mut c = Client::connect(proto, proxy.addr).await;
        let path = format!("/h-{proto:?}?cc=max-age=60");
        let (head, body) = send(&mut c, Method::HEAD, &path, &[]).await;
        assert_eq!(
            (hdr(&head, "x-cache-status").as_str(), body.as_str()),
            ("MISS", "")
        );
        let (resp, body) = send(&mut c, Method::GET, &path, &[]).await;
        assert_eq!(
            (hdr(&resp, "x-cache-status").as_str(), body.as_str()),
            ("HIT", "#1")
        );
        let (head, body) = send(&mut c, Method::HEAD, &path, &[]).await;
        assert_eq!(
            (hdr(&head, "x-cache-status").as_str(), body.as_str()),
            ("HIT", "")
        );
        assert_eq!(origin.seen.methods(), [Method::GET]);
        origin.seen.log.lock().expect("origin log").clear();
        origin.requests.store(0, Ordering::SeqCst);
    }
    // A body announced past item_max_size (1 MB) is not read for a HEAD: the head comes back
    // at once.
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let (head, body) = send(&mut c, Method::HEAD, "/hb?cc=max-age=60&len=3000000", &[]).await;
    assert_eq!((head.status().as_u16(), body.as_str()), (200, ""));
    // An answer that may not be stored: the first HEAD was asked as a GET to find out, the
    // next goes as a HEAD.
    origin.seen.log.lock().expect("origin log").clear();
    for _ in 0..2 {
        let (head, body) = send(&mut c, Method::HEAD, "/hn?cc=no-store", &[]).await;
        assert_eq!(
            (hdr(&head, "x-cache-status").as_str(), body.as_str()),
            ("MISS", "")
        );
    }
    assert_eq!(origin.seen.methods(), [Method::GET, Method::HEAD]);
}
