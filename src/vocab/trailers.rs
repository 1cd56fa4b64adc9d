//! Trailer sections crossing the proxy, in either direction (RFC 9110 §6.5.1). A field that
//! frames the message, routes or authenticates it, modifies the request, controls the answer or
//! describes the content cannot be acted on after the content; and a recipient that merges
//! trailers into the header section (Apache's `MergeTrailers`) would take it as one, so
//! `X-Forwarded-For` or `Host` in a request's trailers would get past the fields the proxy sets.
//! Those go, with the hop-by-hop ones (HTTP/2 refuses connection-specific fields in trailers as
//! in heads, RFC 9113 §8.2.2, and reset the whole answer for one). What is left passes: gRPC's
//! status, checksums, an application's own fields. Trailers are rare, so none of this is on
//! the way of a body's data.

use std::task::Poll;

use http::HeaderMap;
use http_body::Frame;

use super::hop_by_hop::remove_hop_by_hop;

/// `polled`, with its trailers (when the frame is them) fit to cross.
pub fn fit_frame<D, E>(
    mut polled: Poll<Option<Result<Frame<D>, E>>>,
) -> Poll<Option<Result<Frame<D>, E>>> {
    if let Poll::Ready(Some(Ok(frame))) = &mut polled {
        if let Some(trailers) = frame.trailers_mut() {
            remove_unfit(trailers);
        }
    }
    polled
}

/// Takes out of a trailer section the hop-by-hop fields and those that only a header section
/// may carry.
pub fn remove_unfit(trailers: &mut HeaderMap) {
    remove_hop_by_hop(trailers);
    let unfit: Vec<_> = trailers
        .keys()
        .filter(|name| header_section_only(name.as_str()))
        .cloned()
        .collect();
    for name in unfit {
        trailers.remove(name);
    }
}

/// A field that only means something in a header section, or that the proxy (or a
/// forward-auth service) sets itself; spelled with `_` for `-` too, as CGI-style backends read
/// both alike.
fn header_section_only(name: &str) -> bool {
    if name.contains('_') {
        return header_section_only_as_spelled(&name.replace('_', "-"));
    }
    header_section_only_as_spelled(name)
}

fn header_section_only_as_spelled(name: &str) -> bool {
    super::headers::is_identity_field(name)
        || matches!(
            name,
            // Framing, routing, the content's format.
            "content-length" | "content-type" | "content-encoding" | "content-range" | "trailer"
            | "te" | "host"
            // Authentication and state.
            | "authorization" | "proxy-authorization" | "www-authenticate"
            | "proxy-authenticate" | "cookie" | "set-cookie"
            // Request modifiers and response controls.
            | "cache-control" | "pragma" | "expect" | "max-forwards" | "range" | "age"
            | "expires" | "date" | "location" | "retry-after" | "vary"
            // What the proxy says about the client and the request.
            | "forwarded" | "via" | "x-real-ip" | "x-request-id"
        )
        || name.starts_with("if-")
        || name.starts_with("x-forwarded-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fields_fit_for_a_trailer_section_are_left() {
        let mut trailers = HeaderMap::new();
        for (name, value) in [
            ("connection", "close, x-named"),
            ("x-named", "by connection"),
            ("keep-alive", "5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("content-length", "99"),
            ("host", "evil.example"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-request-id", "forged"),
            ("authorization", "Basic Zm9v"),
            ("if-match", "\"e\""),
            ("grpc-status", "0"),
            ("grpc-message", "fine"),
            ("x-checksum", "abc"),
            ("remote-user", "admin"),
            ("remote_user", "root"),
            ("x-auth-role", "superuser"),
            ("x_forwarded_for", "6.6.6.6"),
        ] {
            trailers.append(name, value.parse().expect("a value"));
        }
        remove_unfit(&mut trailers);
        let mut left: Vec<&str> = trailers.keys().map(|name| name.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["grpc-message", "grpc-status", "x-checksum"]);
    }

    #[test]
    fn data_frames_pass_untouched() {
        let polled: Poll<Option<Result<Frame<&str>, ()>>> = Poll::Ready(Some(Ok(Frame::data("x"))));
        let Poll::Ready(Some(Ok(frame))) = fit_frame(polled) else {
            panic!("not a frame");
        };
        assert_eq!(frame.into_data().ok(), Some("x"));
    }
}
