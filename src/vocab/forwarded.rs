//! The `X-Forwarded-For`, `-Proto` and `-Host` fields a request gets on its way to a backend
//! (SPEC §6.2), kept beside its head until the head is written.
//!
//! Most requests carry none of these fields and no route rule sets one. Then the three are
//! written straight into the HTTP/1.1 head the inline client sends, after the request's own
//! fields, instead of being hashed into its `HeaderMap` and read back out of it. hyper's client
//! (HTTP/2, TLS and upgrades) only takes a map: for it they are inserted ([`Deferred::insert_into`]),
//! and a request sent again after that carries them in its map, so the inline client then
//! writes them from there only.

use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{HeaderMap, HeaderValue};

use super::headers::{append_forwarded_for, set_forwarded_proto_host, X_FORWARDED_FOR};

/// The three fields of one request.
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

    /// The fields for a request whose map has none of them (and gets none from a route rule):
    /// they wait for the head to be written.
    pub fn defer(self) -> Deferred {
        Deferred {
            fields: self,
            in_map: AtomicBool::new(false),
        }
    }
}

/// Fields for a request that has none of its own, not yet in its map.
#[derive(Debug)]
pub struct Deferred {
    fields: Forwarded,
    /// Inserted into the request's map for hyper's client: every copy of the head made since
    /// has them.
    in_map: AtomicBool,
}

impl Deferred {
    /// Sets the fields in `headers` (again, if they are there already) for a client that reads
    /// them from the map.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        let f = &self.fields;
        headers.insert(X_FORWARDED_FOR.clone(), f.client_ip.clone());
        set_forwarded_proto_host(headers, f.tls, f.host.clone());
        self.in_map.store(true, Ordering::Relaxed);
    }

    /// The fields still to write into the head, or `None` when the map has them.
    pub fn unwritten(&self) -> Option<&Forwarded> {
        (!self.in_map.load(Ordering::Relaxed)).then_some(&self.fields)
    }
}

impl Forwarded {
    /// `X-Forwarded-Proto`'s value.
    pub fn proto(&self) -> &'static HeaderValue {
        if self.tls {
            &HTTPS
        } else {
            &HTTP
        }
    }
}

static HTTPS: HeaderValue = HeaderValue::from_static("https");
static HTTP: HeaderValue = HeaderValue::from_static("http");

#[cfg(test)]
mod tests {
    use http::header::HeaderName;

    use super::*;
    use crate::vocab::headers::{is_forwarded_field, X_FORWARDED_HOST, X_FORWARDED_PROTO};

    fn fields(host: Option<&'static str>) -> Forwarded {
        Forwarded {
            client_ip: HeaderValue::from_static("10.0.0.7"),
            tls: true,
            host: host.map(HeaderValue::from_static),
        }
    }

    fn unwritten(deferred: &Deferred) -> Option<Vec<(String, String)>> {
        deferred.unwritten().map(|f| {
            let mut fields = vec![
                (
                    X_FORWARDED_FOR.to_string(),
                    f.client_ip.to_str().expect("ASCII").to_owned(),
                ),
                (
                    X_FORWARDED_PROTO.to_string(),
                    f.proto().to_str().expect("ASCII").to_owned(),
                ),
            ];
            if let Some(host) = &f.host {
                fields.push((
                    X_FORWARDED_HOST.to_string(),
                    host.to_str().expect("ASCII").to_owned(),
                ));
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
        let deferred = fields(Some("app.test:8443")).defer();
        assert_eq!(
            unwritten(&deferred),
            pairs(&[
                ("x-forwarded-for", "10.0.0.7"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "app.test:8443"),
            ])
        );
        let plain = Forwarded {
            tls: false,
            ..fields(None)
        }
        .defer();
        assert_eq!(
            unwritten(&plain),
            pairs(&[
                ("x-forwarded-for", "10.0.0.7"),
                ("x-forwarded-proto", "http")
            ])
        );
    }

    /// Once in the map (hyper's client took the request), a head written from that map must not
    /// carry them twice; inserting again leaves one of each.
    #[test]
    fn fields_inserted_into_the_map_are_not_written_again() {
        let deferred = fields(Some("app.test")).defer();
        let mut map = HeaderMap::new();
        deferred.insert_into(&mut map);
        deferred.insert_into(&mut map);
        assert_eq!(map.len(), 3);
        assert_eq!(map["x-forwarded-for"], "10.0.0.7");
        assert_eq!(map["x-forwarded-proto"], "https");
        assert_eq!(map["x-forwarded-host"], "app.test");
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
    fn the_three_names_are_recognised() {
        for name in [&X_FORWARDED_FOR, &X_FORWARDED_PROTO, &X_FORWARDED_HOST] {
            assert!(is_forwarded_field(name), "{name}");
        }
        assert!(!is_forwarded_field(&http::header::HOST));
        assert!(!is_forwarded_field(&HeaderName::from_static(
            "x-forwarded-port"
        )));
    }
}
