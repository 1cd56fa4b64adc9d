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
