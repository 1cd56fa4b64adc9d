//! How a connection's client side ends: a lingering close for a client still sending what no
//! one will read ([`linger`]), and noticing a client that left while its request waits for the
//! answer ([`client_left`]).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;

use super::{body, Socket, READ_ROOM};

/// Ends a connection whose client is still sending a body nobody will read (an answer that came
/// before it, a 413, a 401): the sending side is shut down, so the client reads the answer and
/// its end, and what it sends is read and dropped until it closes. Closed at once instead,
/// with bytes unread, the socket would send a reset, and a client still writing its body (as
/// hyper's, and browsers', do) would take the reset for the answer (nginx's `lingering_close`).
/// The connection's head timeout ends a client that never stops (`idle::drive`).
pub(in crate::server) fn linger<IO: Socket>(
    io: &mut IO,
    read: &mut BytesMut,
    shut: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<()> {
    if !*shut {
        // Errors do not matter: the connection is over either way.
        let _ = ready!(Pin::new(&mut *io).poll_shutdown(cx));
        *shut = true;
    }
    loop {
        read.clear();
        read.reserve(READ_ROOM);
        match ready!(tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, read)) {
            Ok(0) | Err(_) => return Poll::Ready(()),
            Ok(_) => {}
        }
    }
}

/// [`linger`] as a future of its own, for a connection served elsewhere (hyper's, a refused
/// plain request on a TLS port); `shut`: its sending side is shut down already. The caller
/// bounds it with a deadline.
pub(in crate::server) async fn lingering_close<IO: Socket>(io: &mut IO, shut: bool) {
    let (mut dropped, mut shut) = (BytesMut::new(), shut);
    std::future::poll_fn(|cx| linger(io, &mut dropped, &mut shut, cx)).await;
}

/// Whether the client has closed the connection (or it failed) while its request waits for
/// the answer. What it sent meanwhile is kept in `read` for later: a pipelined request is no
/// sign of leaving, and a client that pipelined a whole buffer's worth is not looked at. While
/// the request's body is still read, its own reads notice the end ([`body::Feed::cut`]).
///
/// An end of the stream counts as leaving, as with nginx: a client that half-closes after its
/// request (nc -N) cannot be told from one that is gone.
pub(super) fn client_left<IO: Socket>(
    io: &mut IO,
    read: &mut BytesMut,
    feed: &Option<body::Feed>,
    cx: &mut Context<'_>,
) -> bool {
    if feed.as_ref().is_some_and(|feed| !feed.is_done()) {
        return false;
    }
    while read.len() < READ_ROOM {
        read.reserve(READ_ROOM - read.len());
        match tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, read) {
            Poll::Ready(Ok(0) | Err(_)) => return true,
            Poll::Ready(Ok(_)) => {}
            Poll::Pending => return false,
        }
    }
    false
}
