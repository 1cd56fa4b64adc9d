//! Request-head handling on arbitrary heads: the fuzzer's bytes are cut into a method, a target
//! and header lines; what `http` accepts goes through the checks before routing
//! (`routing::check_head`), host normalisation and the header rewriting done before forwarding
//! (hop-by-hop removal with `Connection`-listed names, X-Forwarded-*, `araleztoken` removal).
//! Nothing may panic, no hop-by-hop header may survive the rewrite, and the same fields read
//! one by one as a backend's answer (`AnswerHopByHop`) end as the same map.
#![no_main]

use aralez::routing::check_head;
use aralez::vocab::{self, headers, hop_by_hop, normalise, token_param};
use http::{header, HeaderName, HeaderValue, Method, Request, Uri, Version};
use libfuzzer_sys::fuzz_target;

/// Splits `data` at `\n` into a request line (`METHOD TARGET V`) and header lines (`name:value`).
fn request(data: &[u8]) -> Option<Request<()>> {
    let mut lines = data.split(|b| *b == b'\n');
    let first = lines.next()?;
    let mut words = first.splitn(3, |b| *b == b' ');
    let method = Method::from_bytes(words.next()?).ok()?;
    let uri = Uri::try_from(words.next()?).ok()?;
    let version = match words.next() {
        Some(b"1.0") => Version::HTTP_10,
        Some(b"2") => Version::HTTP_2,
        _ => Version::HTTP_11,
    };
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .version(version)
        .body(())
        .ok()?;
    for line in lines {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(&line[colon + 1..]),
        ) else {
            continue;
        };
        req.headers_mut().append(name, value);
    }
    Some(req)
}

fuzz_target!(|data: &[u8]| {
    let Some(mut req) = request(data) else {
        return;
    };
    let host = match check_head(&req) {
        Ok(host) => host.cloned(),
        Err(_) => return,
    };
    let mut buf = [0u8; normalise::MAX_HOST];
    if let Some(host) = &host {
        let _ = normalise::host(host.as_bytes(), &mut buf);
    }
    let _ = normalise::path(req.uri().path());
    let addressed = req
        .headers()
        .get(header::HOST)
        .cloned()
        .or_else(|| vocab::authority_host(req.uri()));
    let mut answer = hop_by_hop::AnswerHopByHop::default();
    let mut read_as_answer = http::HeaderMap::new();
    for (name, value) in req.headers() {
        if answer.keeps(name, value.as_bytes()) {
            read_as_answer.append(name.clone(), value.clone());
        }
    }
    answer.finish(&mut read_as_answer);
    token_param::strip_from(req.uri_mut());
    let headers = req.headers_mut();
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    hop_by_hop::remove_hop_by_hop(headers);
    assert_eq!(&read_as_answer, headers, "read field by field, the map differs");
    for name in listed.iter().chain([
        &header::CONNECTION,
        &header::UPGRADE,
        &header::TRANSFER_ENCODING,
    ]) {
        assert!(
            !headers.contains_key(name),
            "{name} survived hop-by-hop removal"
        );
    }
    let ip = headers::client_ip_value("127.0.0.1".parse().unwrap());
    headers::append_forwarded_for(headers, &ip);
    headers::set_forwarded_proto_host(headers, false, addressed);
});
