//! `Vary` variants through the real binary, past cache.rs's: `Accept-Encoding` compared by the
//! codings it accepts, so its spellings share one entry.

use crate::cache_support;
use crate::support;

use http::Method;

use cache_support::*;
use support::*;

/// Every spelling of one choice of codings is one variant: junk values (`gzip, x7`) made an
/// entry each, fetched from the origin, and pushed the browsers' variant out after sixteen.
#[tokio::test]
async fn accept_encoding_spellings_of_one_choice_share_an_entry() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let path = "/coded?cc=max-age=60&vary=accept-encoding";
    let status = |resp: &http::Response<()>| hdr(resp, "x-cache-status");
    let mut ask = async |coding: String| {
        let (resp, _) = send(&mut c, Method::GET, path, &[("accept-encoding", &coding)]).await;
        status(&resp)
    };
    assert_eq!(ask("gzip, deflate".into()).await, "MISS");
    assert_eq!(ask("deflate, gzip".into()).await, "HIT");
    assert_eq!(ask("GZIP;q=0.8, deflate, x1".into()).await, "HIT");
    assert_eq!(
        ask("gzip".into()).await,
        "MISS",
        "another choice, another variant"
    );
    for junk in 0..20 {
        assert_eq!(ask(format!("gzip, x{junk}")).await, "HIT", "x{junk}");
    }
    assert_eq!(ask("gzip, deflate".into()).await, "HIT", "still there");
    assert_eq!(origin.requests(), 2);
}

/// When an answer names other `Vary` fields than the variants stored, they go: the newest
/// answer says what the resource varies on (RFC 9111 §4.1), and an older variant, selected by
/// the fields it was stored under, was served in place of the one the new fields select.
#[tokio::test]
async fn an_answer_with_another_vary_replaces_the_variants_of_the_old_one() {
    let origin = Origin::start().await;
    let proxy = proxy_for(&origin);
    let mut c = Client::connect(Proto::H1, proxy.addr).await;
    let path = "/changing?cc=max-age=60";
    let mut ask = async |headers: &[(&str, &str)]| {
        let (resp, body) = send(&mut c, Method::GET, path, headers).await;
        (hdr(&resp, "x-cache-status"), body)
    };
    let by_language = [
        ("x-origin-vary", "accept-language"),
        ("accept-language", "en"),
    ];
    assert_eq!(ask(&by_language).await, ("MISS".into(), "#1".into()));
    assert_eq!(ask(&by_language).await, ("HIT".into(), "#1".into()));
    // The resource now varies by tenant.
    let tenant_one = [
        ("x-origin-vary", "x-tenant"),
        ("x-tenant", "t1"),
        ("accept-language", "de"),
    ];
    assert_eq!(ask(&tenant_one).await, ("MISS".into(), "#2".into()));
    // Another tenant in English: no variant of the tenant's, not the old English one.
    let tenant_two = [
        ("x-origin-vary", "x-tenant"),
        ("x-tenant", "t2"),
        ("accept-language", "en"),
    ];
    assert_eq!(ask(&tenant_two).await, ("MISS".into(), "#3".into()));
    // The same fields in another order are the same `Vary`: an answer naming them so keeps
    // the variants stored under the other order.
    let mut by = async |order: &str, tenant: &str| {
        let asked = [
            ("x-origin-vary", order),
            ("x-tenant", tenant),
            ("accept-language", "en"),
        ];
        ask(&asked).await
    };
    assert_eq!(
        by("Accept-Language, X-Tenant", "t3").await,
        ("MISS".into(), "#4".into())
    );
    assert_eq!(
        by("Accept-Language, X-Tenant", "t4").await,
        ("MISS".into(), "#5".into())
    );
    assert_eq!(
        by("x-tenant, accept-language", "t5").await,
        ("MISS".into(), "#6".into())
    );
    assert_eq!(
        by("x-tenant, accept-language", "t3").await,
        ("HIT".into(), "#4".into())
    );
    assert_eq!(
        by("x-tenant, accept-language", "t4").await,
        ("HIT".into(), "#5".into())
    );
    assert_eq!(origin.requests(), 6);
}
