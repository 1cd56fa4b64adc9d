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
    // Each request: the answer's `Vary`, the request's tenant (if any) and language, and what
    // the cache answers with (the body names the origin's request that made it).
    let steps = [
        ("accept-language", None, "en", "MISS", "#1"),
        ("accept-language", None, "en", "HIT", "#1"),
        // The resource now varies by tenant.
        ("x-tenant", Some("t1"), "de", "MISS", "#2"),
        // Another tenant in English: no variant of the tenant's, not the old English one.
        ("x-tenant", Some("t2"), "en", "MISS", "#3"),
        // The same fields in another order are the same `Vary`: an answer naming them so
        // keeps the variants stored under the other order.
        ("Accept-Language, X-Tenant", Some("t3"), "en", "MISS", "#4"),
        ("Accept-Language, X-Tenant", Some("t4"), "en", "MISS", "#5"),
        ("x-tenant, accept-language", Some("t5"), "en", "MISS", "#6"),
        ("x-tenant, accept-language", Some("t3"), "en", "HIT", "#4"),
        ("x-tenant, accept-language", Some("t4"), "en", "HIT", "#5"),
    ];
    for (step, (vary, tenant, language, status, body)) in steps.into_iter().enumerate() {
        let mut asked = vec![("x-origin-vary", vary), ("accept-language", language)];
        asked.extend(tenant.map(|t| ("x-tenant", t)));
        let (resp, got) = send(&mut c, Method::GET, path, &asked).await;
        let answered = (hdr(&resp, "x-cache-status"), got);
        assert_eq!(
            answered,
            (status.to_string(), body.to_string()),
            "step {step}"
        );
    }
    assert_eq!(origin.requests(), 6);
}
