//! WebSocket through the proxy with no config: HTTP/1.1 Upgrade -> 101 -> frames both ways.

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use support::*;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

/// A WebSocket echo server (real handshake and framing); returns its address.
async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    if let Message::Close(frame) = msg {
                        let _ = ws.send(Message::Close(frame)).await;
                        return;
                    }
                    // Text and binary are echoed; pings are answered by the library as it reads.
                    if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn ws_route(backend: std::net::SocketAddr) -> String {
    format!("upstreams:\n  chat.local:\n    paths:\n      \"/\": {{servers: [\"{backend}\"], healthcheck: false}}\n")
}

async fn exercise<S>(stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut ws, resp) = tokio_tungstenite::client_async("ws://chat.local/socket", stream)
        .await
        .expect("WebSocket handshake through the proxy");
    assert_eq!(resp.status(), 101);
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i % 253) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap().into_data().as_ref(),
        big.as_slice()
    );
    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Pong(b"are you there".to_vec().into())
    );
    // Idle longer than client_header_timeout: an upgraded connection is not an HTTP connection.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ws.send(Message::text("still here")).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text("still here")
    );
    ws.close(None).await.unwrap();
    let mut closed = false;
    while let Some(msg) = ws.next().await {
        if matches!(msg, Ok(Message::Close(_)) | Err(_)) {
            closed = true;
            break;
        }
    }
    assert!(
        closed || ws.next().await.is_none(),
        "close handshake completes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_over_plain_and_tls_listeners() {
    let backend = echo_server().await;
    let certs = tempfile::tempdir().unwrap();
    let root = write_self_signed(certs.path(), "chat", &["chat.local"]);
    let main = format!(
        "client_header_timeout: 1\nproxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"",
        certs.path().display()
    );
    let proxy = ProxyProcess::start(&ws_route(backend), &main);
    exercise(TcpStream::connect(proxy.addr).await.unwrap()).await;

    let tls_addr = proxy.logged_addr("listening on https://");
    let config = tls_client_config(&[root], &[b"http/1.1"]);
    let tcp = TcpStream::connect(tls_addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("chat.local").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    exercise(tls).await;
}
