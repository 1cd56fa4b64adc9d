//! Over real sockets on 127.0.0.1: what epoll holds for an accepted client (read from the
//! kernel's own account, `/proc/self/fdinfo`), and that a read, peek or write that has to wait
//! is woken and finishes, also when a write widens the registration a read waits on.

use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{ClientListener, ClientTcp};

const EPOLLIN: u32 = libc::EPOLLIN as u32;
const EPOLLOUT: u32 = libc::EPOLLOUT as u32;

/// Longer than any of these exchanges takes: a test that would hang fails instead.
const PATIENCE: Duration = Duration::from_secs(10);

/// The event masks every epoll instance of this process holds for descriptor `fd`. An
/// instance may be open under more than one descriptor (tokio's driver keeps a duplicate):
/// each registration counts once (its line names the registration's own token).
fn epoll_masks(fd: RawFd) -> Vec<u32> {
    let mut lines = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let path = entry.expect("an fd entry").path();
        let is_epoll = std::fs::read_link(&path)
            .is_ok_and(|target| target.to_string_lossy() == "anon_inode:[eventpoll]");
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{name}")) else {
            continue;
        };
        if is_epoll {
            let about_fd = info.lines().filter(|line| mask_of(line, fd).is_some());
            lines.extend(about_fd.map(str::to_owned));
        }
    }
    lines.iter().filter_map(|line| mask_of(line, fd)).collect()
}

/// The mask of an fdinfo line `tfd: <fd> events: <hex> ...` about `fd`.
fn mask_of(line: &str, fd: RawFd) -> Option<u32> {
    let mut words = line.split_whitespace();
    (words.next()? == "tfd:" && words.next()?.parse::<RawFd>().ok()? == fd).then_some(())?;
    (words.next()? == "events:").then_some(())?;
    u32::from_str_radix(words.next()?, 16).ok()
}

/// Polls `waiting` once; it must wait.
fn poll_once_waits<F: Future>(waiting: std::pin::Pin<&mut F>, what: &str) {
    let waker = futures_util::task::noop_waker();
    let polled = waiting.poll(&mut Context::from_waker(&waker));
    assert!(matches!(polled, Poll::Pending), "the {what} did not wait");
}

/// `fd` is in epoll once, and of `EPOLLIN` and `EPOLLOUT` for exactly those in `interest`.
fn assert_registered_only_for(fd: RawFd, interest: u32) {
    let masks = epoll_masks(fd);
    assert_eq!(masks.len(), 1, "one registration: {masks:x?}");
    assert_eq!(masks[0] & (EPOLLIN | EPOLLOUT), interest, "{:x}", masks[0]);
}

/// An accepted client, and tokio's socket at the other end, which sent `first` before the
/// accept (so that it is there to read, as behind a deferred accept).
async fn accepted_pair_after(first: &[u8]) -> (ClientTcp, tokio::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("address");
    let listener = ClientListener::new(listener).expect("register the listener");
    let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
    client.write_all(first).await.expect("first bytes");
    let (server, peer) = listener.accept().await.expect("accept");
    assert_eq!(peer, client.local_addr().expect("client address"));
    (server, client)
}

async fn accepted_pair() -> (ClientTcp, tokio::net::TcpStream) {
    accepted_pair_after(b"").await
}

#[tokio::test]
async fn a_client_is_registered_for_reading_only_once_a_read_has_to_wait() {
    let (mut server, mut client) = accepted_pair_after(b"first").await;
    let fd = server.as_fd_raw();
    assert_eq!(epoll_masks(fd), Vec::<u32>::new(), "registered at accept");
    let mut got = [0u8; 5];
    server.read_exact(&mut got).await.expect("first read");
    assert_eq!(&got, b"first");
    assert_eq!(
        epoll_masks(fd),
        Vec::<u32>::new(),
        "a read that found bytes registered"
    );
    // Nothing more has come: this read waits, and registers.
    let mut second = [0u8; 6];
    let mut reading = pin!(server.read_exact(&mut second));
    poll_once_waits(reading.as_mut(), "read");
    assert_registered_only_for(fd, EPOLLIN);
    // Only the registration can wake the read now.
    client.write_all(b"second").await.expect("second bytes");
    tokio::time::timeout(PATIENCE, reading)
        .await
        .expect("the read was never woken")
        .expect("second read");
    assert_eq!(&second, b"second");
    // The same account shows tokio's own socket registered for both, from its start.
    assert_registered_only_for(client.as_raw_fd(), EPOLLIN | EPOLLOUT);
}

#[tokio::test]
async fn a_client_answered_without_waiting_is_never_registered() {
    // A `Connection: close` request behind a deferred accept: read, answered, closed.
    let (mut server, mut client) = accepted_pair_after(b"GET / HTTP/1.1\r\n\r\n").await;
    let mut request = [0u8; 18];
    server.read_exact(&mut request).await.expect("request");
    server
        .write_all(b"HTTP/1.1 200 OK\r\n")
        .await
        .expect("answer");
    server.shutdown().await.expect("shutdown");
    assert_eq!(epoll_masks(server.as_fd_raw()), Vec::<u32>::new());
    assert_eq!(
        descriptors_of_the_same_socket(server.as_fd_raw()),
        Vec::<RawFd>::new()
    );
    drop(server);
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.expect("answer");
    assert_eq!(answer, b"HTTP/1.1 200 OK\r\n");
}

#[tokio::test]
async fn a_peek_that_waits_registers_and_is_woken() {
    let (mut server, mut client) = accepted_pair().await;
    let fd = server.as_fd_raw();
    let mut buf = [0u8; 8];
    let peeked = {
        let mut peeking = pin!(server.peek(&mut buf));
        poll_once_waits(peeking.as_mut(), "peek");
        assert_registered_only_for(fd, EPOLLIN);
        client.write_all(b"PROXY").await.expect("bytes");
        tokio::time::timeout(PATIENCE, peeking)
            .await
            .expect("the peek was never woken")
            .expect("peek")
    };
    assert_eq!(&buf[..peeked], b"PROXY");
    // A peek leaves the bytes for the next read.
    let mut read = [0u8; 5];
    server.read_exact(&mut read).await.expect("read");
    assert_eq!(&read, b"PROXY");
}

/// Far more than loopback's socket buffers hold while the client reads nothing.
fn more_than_the_buffers_hold() -> Vec<u8> {
    (0..32 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn a_write_that_waits_registers_the_socket_for_writing_and_is_woken() {
    let (mut server, mut client) = accepted_pair().await;
    let fd = server.as_fd_raw();
    let sent = more_than_the_buffers_hold();
    let mut writing = pin!(server.write_all(&sent));
    poll_once_waits(writing.as_mut(), "write");
    assert_registered_only_for(fd, EPOLLOUT);
    assert_eq!(
        descriptors_of_the_same_socket(fd),
        Vec::<RawFd>::new(),
        "a second descriptor for writing"
    );
    // Only the client's reading can wake the write now.
    let mut received = vec![0u8; sent.len()];
    let read = client.read_exact(&mut received);
    let both = async { tokio::join!(writing, read) };
    let (written, read) = tokio::time::timeout(PATIENCE, both)
        .await
        .expect("the write was never woken");
    written.expect("write");
    read.expect("read");
    assert!(received == sent, "the bytes came out changed");
}

#[tokio::test]
async fn a_read_waiting_when_a_write_widens_the_registration_is_still_woken() {
    let (server, mut client) = accepted_pair().await;
    let fd = server.as_fd_raw();
    let (mut from_client, mut to_client) = tokio::io::split(server);
    let sent = more_than_the_buffers_hold();
    // One task, as a connection's: its read waits first (registered for reading), then its
    // write fills the buffer and widens the registration to both, replacing it.
    let connection = tokio::spawn(async move {
        let mut got = [0u8; 5];
        tokio::select! {
            biased;
            read = from_client.read_exact(&mut got) => read.map(|_| got),
            written = to_client.write_all(&sent) => panic!("the client reads nothing: {written:?}"),
        }
    });
    let widened = async {
        while !matches!(epoll_masks(fd)[..], [mask] if mask & (EPOLLIN | EPOLLOUT) == EPOLLIN | EPOLLOUT)
        {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(PATIENCE, widened)
        .await
        .expect("never registered for both");
    assert_eq!(descriptors_of_the_same_socket(fd), Vec::<RawFd>::new());
    // The read's waker was on the replaced registration; only the new one hears of these.
    client.write_all(b"after").await.expect("bytes");
    let read = tokio::time::timeout(PATIENCE, connection)
        .await
        .expect("the waiting read was never woken")
        .expect("the connection's task");
    assert_eq!(&read.expect("read"), b"after");
}

/// The other descriptors of this process open on the socket `fd` is (the same inode).
fn descriptors_of_the_same_socket(fd: RawFd) -> Vec<RawFd> {
    let name = |fd: &str| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
    let socket = name(&fd.to_string()).expect("the socket's name");
    let mut others = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let entry = entry.expect("an fd entry").file_name();
        let Some(other) = entry.to_str() else {
            continue;
        };
        if name(other).as_ref() == Some(&socket) && other != fd.to_string() {
            others.extend(other.parse::<RawFd>().ok());
        }
    }
    others
}

impl ClientTcp {
    fn as_fd_raw(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}
