//! A plain HTTP request sent to a TLS port. Handed to the TLS handshake, it would get a TLS
//! alert: bytes that a plain client shows as garbage or as a bare "connection reset". nginx
//! answers it with a readable 400 ("The plain HTTP request was sent to HTTPS port"); this does
//! the same, from the connection's first byte: a TLS connection starts with a handshake
//! record (22), an HTTP/1 request with a method's capital letter.
//!
//! The request itself is never read as HTTP: the answer goes out, then the connection ends as
//! HTTP/1.1's do after an early answer (a lingering close, until the handshake's deadline).

use std::io;

use tokio::io::AsyncWriteExt;

use super::client_tcp::ClientTcp;

/// The first byte of a TLS record carrying a handshake message (RFC 8446 §5.1).
const TLS_HANDSHAKE: u8 = 22;

/// What nginx's text says, as a whole answer that closes the connection.
const ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\
content-type: text/plain\r\n\
content-length: 50\r\n\
connection: close\r\n\
\r\n\
The plain HTTP request was sent to an HTTPS port.\n";

/// The length of [`ANSWER`]'s body (its `content-length`), for the access log.
pub const BODY_BYTES: u64 = 50;

/// What a connection's first bytes are, as far as the TLS listener cares.
#[derive(Debug, PartialEq, Eq)]
pub enum FirstBytes {
    /// A TLS record, or anything the handshake should judge.
    Tls,
    /// What looks like an HTTP/1 request line.
    PlainHttp,
    /// The client closed (or the socket failed) before sending anything.
    Nothing,
}

/// Looks at (without taking) the connection's first byte, waiting for it if need be. Behind a
/// deferred accept it is there already, and the look is one `recv(MSG_PEEK)`.
pub async fn first_bytes(stream: &mut ClientTcp) -> FirstBytes {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => FirstBytes::Nothing,
        Ok(_) => judge(first[0]),
    }
}

fn judge(first: u8) -> FirstBytes {
    match first {
        TLS_HANDSHAKE => FirstBytes::Tls,
        b'A'..=b'Z' => FirstBytes::PlainHttp,
        _ => FirstBytes::Tls,
    }
}

/// Answers a plain request with the 400 and ends the connection with a lingering close
/// ([`super::h1::linger`]), so the close is no reset that loses the answer. The caller bounds
/// it with the handshake's deadline.
pub async fn answer(stream: &mut ClientTcp) -> io::Result<()> {
    stream.write_all(ANSWER).await?;
    super::h1::lingering_close(stream, false).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_record_goes_to_tls_and_a_method_is_plain_http() {
        assert_eq!(judge(0x16), FirstBytes::Tls);
        for method in [b'G', b'P', b'H', b'D', b'O', b'C'] {
            assert_eq!(judge(method), FirstBytes::PlainHttp);
        }
        // An SSLv2-style hello and binary junk are the handshake's to judge.
        assert_eq!(judge(0x80), FirstBytes::Tls);
        assert_eq!(judge(0), FirstBytes::Tls);
    }

    #[test]
    fn the_answer_says_what_it_is_and_its_length_is_right() {
        let text = std::str::from_utf8(ANSWER).expect("ascii");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert_eq!(body.len() as u64, BODY_BYTES, "the access log's bytes");
        assert!(body.contains("plain HTTP request"));
    }
}
