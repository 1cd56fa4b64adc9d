//! The path normaliser and the checks around it on arbitrary targets. Nothing panics on any
//! path; for a path the router lets through (not `is_ambiguous`), normalising is idempotent
//! (routing and a backend that decodes once agree) and leaves no dot segment behind.
#![no_main]

use aralez::vocab::normalise;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // What routing sees: the path of a target `http` accepted.
    let Ok(target) = http::uri::PathAndQuery::try_from(data) else {
        return;
    };
    let raw = target.path();
    let once = normalise::path(raw);
    let _ = normalise::percent_decode(raw);
    let _ = normalise::prefix_matches(&once, raw);
    let mut buf = [0u8; normalise::MAX_HOST];
    if let Some(host) = normalise::host(data, &mut buf) {
        assert!(!host.is_empty() && host.len() <= normalise::MAX_HOST);
        assert_eq!(host, host.to_ascii_lowercase());
    }
    if normalise::is_ambiguous(raw) {
        return;
    }
    let twice = normalise::path(&once);
    assert_eq!(once, twice, "normalising {raw:?} twice changed it");
    assert!(once.starts_with('/'), "{raw:?} normalised to {once:?}");
    for segment in once.split('/').skip(1) {
        assert!(
            segment != "." && segment != "..",
            "{raw:?} kept a dot segment: {once:?}"
        );
    }
});
