//! Chunked request bodies whose chunks carry extensions, as S3 and MinIO clients stream-sign
//! their uploads (`aws-chunked`: `;chunk-signature=<64 hex digits>` on every chunk): hyper's
//! decoder, patched (vendor/hyper/PATCHED.md), bounds one chunk's extensions, not a body's.

use crate::support;

use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `request` (which asks to close) and reads the whole answer.
async fn exchange_raw(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got));
    assert!(read.await.is_ok(), "no whole answer in time");
    String::from_utf8_lossy(&got).into_owned()
}

/// A chunked PUT to `/collect` of `chunks` chunks of 1 KiB, each with `extension`.
fn signed_upload(chunks: usize, extension: &str) -> Vec<u8> {
    let mut req = b"PUT /collect HTTP/1.1\r\nHost: any\r\nConnection: close\r\n\
                    Transfer-Encoding: chunked\r\n\r\n"
        .to_vec();
    for _ in 0..chunks {
        req.extend_from_slice(format!("400{extension}\r\n").as_bytes());
        req.extend_from_slice(&[b'd'; 1024]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(format!("0{extension}\r\n\r\n").as_bytes());
    req
}

/// 300 signed chunks (24 KiB of extensions in all) reach the backend whole: past 16 KiB of
/// them in a body, hyper cut the upload with a 400 (S3 uploads failed past about 12 MB). One
/// chunk's extensions over 16 KiB are still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_extensions_are_bounded_per_chunk_not_per_body() {
    let backend = Backend::builder("b").h1_only().start().await;
    let proxy = ProxyProcess::start(&default_route(&[&backend]), "");
    let signature = format!(";chunk-signature={}", "a".repeat(64));
    let answer = exchange_raw(proxy.addr, &signed_upload(300, &signature)).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(
        answer.ends_with("\r\n\r\n307200"),
        "the backend read it whole: {answer}"
    );

    let huge = format!(";x={}", "a".repeat(17 * 1024));
    let answer = exchange_raw(proxy.addr, &signed_upload(2, &huge)).await;
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
}
