//! The TLS listener's config, driven in memory by a rustls client: its session tickets wait
//! for the connection's first answer and leave in the same flight of records, and a client
//! that got them resumes.

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, ClientConnection, Connection, HandshakeKind, ServerConnection};

use crate::config::main_conf::TlsGrade;

/// aralez's listener config over a fresh self-signed certificate, and a client trusting it.
fn configs() -> (Arc<rustls::ServerConfig>, Arc<ClientConfig>) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = made.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key).unwrap();
    let resolver = Arc::new(SingleCertAndKey::from(CertifiedKey::new(
        vec![cert.clone()],
        signing,
    )));
    let server = {
        let resumption = super::Resumption::new().unwrap();
        super::server_config(resolver, TlsGrade::Medium, &[b"http/1.1"], resumption).unwrap()
    };
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (server, Arc::new(client))
}

/// Everything `from` has to send, as one buffer: what one write would carry.
fn records(from: &mut Connection) -> Vec<u8> {
    let mut out = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut out).unwrap();
    }
    out
}

fn deliver(bytes: &[u8], to: &mut Connection) {
    let mut rest = bytes;
    while !rest.is_empty() {
        to.read_tls(&mut rest).unwrap();
        to.process_new_packets().unwrap();
    }
}

/// Carries a handshake to its end; returns what the server wrote once it had the client's
/// Finished (where rustls alone puts its session tickets).
fn handshake(client: &mut Connection, server: &mut Connection) -> Vec<u8> {
    loop {
        let to_server = records(client);
        deliver(&to_server, server);
        let to_client = records(server);
        deliver(&to_client, client);
        if !server.is_handshaking() {
            return to_client;
        }
    }
}

fn connect(
    server_config: &Arc<rustls::ServerConfig>,
    client_config: &Arc<ClientConfig>,
) -> (Connection, Connection) {
    let name = ServerName::try_from("localhost").unwrap();
    let client = ClientConnection::new(client_config.clone(), name).unwrap();
    let server = ServerConnection::new(server_config.clone()).unwrap();
    (client.into(), server.into())
}

#[test]
fn the_tickets_wait_for_the_first_answer_and_leave_with_it() {
    let (server_config, client_config) = configs();
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let (mut client, mut server) = connect(&server_config, &client_config);
        let after_finished = handshake(&mut client, &mut server);
        assert!(after_finished.is_empty(), "nothing before the answer");
        assert!(!server.wants_write());

        server.writer().write_all(b"hello").unwrap();
        let answer = records(&mut server);
        deliver(&answer, &mut client);

        let mut got = [0u8; 5];
        client.reader().read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        kinds.push(client.handshake_kind());
    }
    // The second connection resumed from a ticket that came with the first answer.
    use HandshakeKind::{Full, Resumed};
    assert_eq!(kinds, [Some(Full), Some(Resumed)]);
}

/// The admin API's pair is read from the two files named, whatever their extensions: a
/// `NAME.pem` beside `NAME.key` was looked for as `NAME.crt`.
#[test]
fn a_single_pair_is_read_from_the_files_named() {
    let dir = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["admin.local".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("admin.pem"), dir.path().join("admin.key"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let (_, pair) = super::single_pair_config(&cert, &key).expect("the pair loads");
    assert_eq!(pair.reload().ok(), Some(false), "read again, unchanged");
}
