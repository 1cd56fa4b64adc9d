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

use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::headers::{
    append_forwarded_for, set_forwarded_proto_host, X_FORWARDED_FOR, X_FORWARDED_HOST,
    X_FORWARDED_PROTO,
};

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

    /// Writes the fields as `name: value` lines of an HTTP/1.1 head, unless the map has them.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        if self.in_map.load(Ordering::Relaxed) {
            return;
        }
        let f = &self.fields;
        write_field(out, &X_FORWARDED_FOR, &f.client_ip);
        out.extend_from_slice(match f.tls {
            true => b"x-forwarded-proto: https\r\n",
            false => b"x-forwarded-proto: http\r\n",
        });
        if let Some(host) = &f.host {
            write_field(out, &X_FORWARDED_HOST, host);
        }
    }
}

fn write_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Whether a route rule that sets `name` must see the fields in the map first.
pub fn is_forwarded_field(name: &HeaderName) -> bool {
    *name == X_FORWARDED_FOR || *name == X_FORWARDED_PROTO || *name == X_FORWARDED_HOST
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(host: Option<&'static str>) -> Forwarded {
        Forwarded {
            client_ip: HeaderValue::from_static("10.0.0.7"),
            tls: true,
            host: host.map(HeaderValue::from_static),
        }
    }

    fn written(deferred: &Deferred) -> String {
        let mut out = Vec::new();
        deferred.write_to(&mut out);
        String::from_utf8(out).expect("ASCII")
    }

    #[test]
    fn deferred_fields_are_written_as_head_lines() {
        let deferred = fields(Some("app.test:8443")).defer();
        assert_eq!(
            written(&deferred),
            "x-forwarded-for: 10.0.0.7\r\nx-forwarded-proto: https\r\nx-forwarded-host: app.test:8443\r\n"
        );
        let plain = Forwarded {
            tls: false,
            ..fields(None)
        }
        .defer();
        assert_eq!(
            written(&plain),
            "x-forwarded-for: 10.0.0.7\r\nx-forwarded-proto: http\r\n"
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
        assert_eq!(written(&deferred), "");
    }

    #[test]
    fn merging_appends_to_the_clients_own_list() {
        let mut map = HeaderMap::new();
        map.insert(&X_FORWARDED_FOR, HeaderValue::from_static("1.1.1.1"));
        map.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("ftp"));
        fields(None).merge_into(&mut map);
        assert_eq!(map["x-forwarded-for"], "1.1.1.1, 10.0.0.7");
        assert_eq!(map["x-forwarded-proto"], "https");
        assert!(is_forwarded_field(&X_FORWARDED_HOST));
        assert!(!is_forwarded_field(&http::header::HOST));
    }
}
