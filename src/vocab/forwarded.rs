//! The fields the proxy adds to every request on its way to a backend (SPEC §6.2):
//! `X-Forwarded-For`, `-Proto`, `-Host` and `X-Request-Id`, kept beside its head until the head
//! is written.
//!
//! Most requests carry none of these fields and no route rule sets one. Then they are written
//! straight into the HTTP/1.1 head the inline client sends, after the request's own fields,
//! instead of being hashed into its `HeaderMap` and read back out of it. hyper's client
//! (HTTP/2, TLS and upgrades) only takes a map: for it they are inserted ([`Deferred::insert_into`]),
//! and a request sent again after that carries them in its map, so the inline client then
//! writes them from there only.

use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{HeaderMap, HeaderValue};

use super::headers::{
    append_forwarded_for, forwarded_proto, set_forwarded_proto_host, X_FORWARDED_FOR, X_REQUEST_ID,
};

/// The three `X-Forwarded-*` fields of one request.
#[derive(Debug)]
pub struct Forwarded {
    /// The client's address, as `X-Forwarded-For` gives it.
    pub client_ip: HeaderValue,
    pub tls: bool,
    /// The host the client asked for, as it sent it.
    pub host: Option<HeaderValue>,
}

impl Forwarded {
    /// Adds the fields to `headers` at once: the client's `X-Forwarded-For` gets the address
    /// appended, its `-Proto` and `-Host` are replaced.
    pub fn merge_into(self, headers: &mut HeaderMap) {
        append_forwarded_for(headers, &self.client_ip);
        set_forwarded_proto_host(headers, self.tls, self.host);
    }

    /// `X-Forwarded-Proto`'s value.
    pub fn proto(&self) -> &'static HeaderValue {
        forwarded_proto(self.tls)
    }
}

/// The proxy's fields for a request whose map has none of them (and gets none from a route
/// rule), not yet in its map.
#[derive(Debug)]
pub struct Deferred {
    fields: Unwritten,
    /// Inserted into the request's map for hyper's client: every copy of the head made since
    /// has them.
    in_map: AtomicBool,
}

/// The fields a request head still needs.
#[derive(Debug)]
pub struct Unwritten {
    pub forwarded: Option<Forwarded>,
    pub request_id: Option<HeaderValue>,
}

impl Deferred {
    /// The fields to write later; `None` when there are none.
    pub fn new(forwarded: Option<Forwarded>, request_id: Option<HeaderValue>) -> Option<Deferred> {
        if forwarded.is_none() && request_id.is_none() {
            return None;
        }
        Some(Deferred {
            fields: Unwritten {
                forwarded,
                request_id,
            },
            in_map: AtomicBool::new(false),
        })
    }

    /// Sets the fields in `headers` (again, if they are there already) for a client that reads
    /// them from the map.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        if let Some(f) = &self.fields.forwarded {
            headers.insert(X_FORWARDED_FOR.clone(), f.client_ip.clone());
            set_forwarded_proto_host(headers, f.tls, f.host.clone());
        }
        if let Some(id) = &self.fields.request_id {
            headers.insert(X_REQUEST_ID.clone(), id.clone());
        }
        self.in_map.store(true, Ordering::Relaxed);
    }

    /// The fields still to write into the head, or `None` when the map has them.
    pub fn unwritten(&self) -> Option<&Unwritten> {
        (!self.in_map.load(Ordering::Relaxed)).then_some(&self.fields)
    }
}

#[cfg(test)]
mod tests {
    use http::header::HeaderName;

    use super::*;
    use crate::vocab::headers::{X_FORWARDED_HOST, X_FORWARDED_PROTO};
    use crate::vocab::hop_by_hop::ProxyFields;

    fn fields(host: Option<&'static str>) -> Forwarded {
        Forwarded {
            client_ip: HeaderValue::from_static("10.0.0.7"),
            tls: true,
            host: host.map(HeaderValue::from_static),
        }
    }

    fn id() -> HeaderValue {
        HeaderValue::from_static("0123abcd")
    }

    fn text(value: &HeaderValue) -> String {
        value.to_str().expect("ASCII").to_owned()
    }

    fn unwritten(deferred: &Deferred) -> Option<Vec<(String, String)>> {
        deferred.unwritten().map(|u| {
            let mut fields = Vec::new();
            if let Some(f) = &u.forwarded {
                fields.push((X_FORWARDED_FOR.to_string(), text(&f.client_ip)));
                fields.push((X_FORWARDED_PROTO.to_string(), text(f.proto())));
                if let Some(host) = &f.host {
                    fields.push((X_FORWARDED_HOST.to_string(), text(host)));
                }
            }
            if let Some(id) = &u.request_id {
                fields.push((X_REQUEST_ID.to_string(), text(id)));
            }
            fields
        })
    }

    fn pairs(list: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
        Some(
            list.iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn deferred_fields_wait_for_the_head() {
        let deferred = Deferred::new(Some(fields(Some("app.test:8443"))), Some(id()));
        let deferred = deferred.expect("fields to write");
        assert_eq!(
            unwritten(&deferred),
            pairs(&[
                ("x-forwarded-for", "10.0.0.7"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "app.test:8443"),
                ("x-request-id", "0123abcd"),
            ])
        );
        let plain = Forwarded {
            tls: false,
            ..fields(None)
        };
        let plain = Deferred::new(Some(plain), None).expect("fields to write");
        assert_eq!(
            unwritten(&plain),
            pairs(&[
                ("x-forwarded-for", "10.0.0.7"),
                ("x-forwarded-proto", "http")
            ])
        );
        let only_id = Deferred::new(None, Some(id())).expect("fields to write");
        assert_eq!(unwritten(&only_id), pairs(&[("x-request-id", "0123abcd")]));
        assert!(Deferred::new(None, None).is_none());
    }

    /// Once in the map (hyper's client took the request), a head written from that map must not
    /// carry them twice; inserting again leaves one of each.
    #[test]
    fn fields_inserted_into_the_map_are_not_written_again() {
        let deferred = Deferred::new(Some(fields(Some("app.test"))), Some(id()));
        let deferred = deferred.expect("fields to write");
        let mut map = HeaderMap::new();
        deferred.insert_into(&mut map);
        deferred.insert_into(&mut map);
        assert_eq!(map.len(), 4);
        assert_eq!(map["x-forwarded-for"], "10.0.0.7");
        assert_eq!(map["x-forwarded-proto"], "https");
        assert_eq!(map["x-forwarded-host"], "app.test");
        assert_eq!(map["x-request-id"], "0123abcd");
        assert_eq!(unwritten(&deferred), None);
    }

    #[test]
    fn merging_appends_to_the_clients_own_list() {
        let mut map = HeaderMap::new();
        map.insert(&X_FORWARDED_FOR, HeaderValue::from_static("1.1.1.1"));
        map.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("ftp"));
        fields(None).merge_into(&mut map);
        assert_eq!(map["x-forwarded-for"], "1.1.1.1, 10.0.0.7");
        assert_eq!(map["x-forwarded-proto"], "https");
    }

    #[test]
    fn the_proxys_names_are_recognised() {
        for name in [&X_FORWARDED_FOR, &X_FORWARDED_PROTO, &X_FORWARDED_HOST] {
            let found = ProxyFields::among([name]);
            assert!(found.forwarded && !found.request_id, "{name}");
        }
        let id = ProxyFields::among([&X_REQUEST_ID]);
        assert!(id.request_id && !id.forwarded);
        let others = [
            http::header::HOST,
            HeaderName::from_static("x-request-ids"),
            HeaderName::from_static("x-forwardedfor"),
        ];
        assert_eq!(ProxyFields::among(&others), ProxyFields::default());
        for other_forwarded in ["x-forwarded-port", "x-forwarded-ports"] {
            let claim = ProxyFields::among([&HeaderName::from_static(other_forwarded)]);
            assert!(claim.claims && !claim.forwarded, "{other_forwarded}");
        }
        let both = ProxyFields::among([&X_REQUEST_ID, &http::header::HOST, &X_FORWARDED_HOST]);
        assert!(both.forwarded && both.request_id);
    }
}
