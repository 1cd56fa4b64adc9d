//! A request body of declared length, from the connection to the service: the connection
//! reads it off the socket as the service takes it, one piece at a time (at most
//! [`MAX_PIECE`] bytes held, whatever the client sends), and the service polls it as a body.
//! Both sides may run in different tasks (hyper's client sends a body from its connection's
//! task), hence the lock; it is the connection's own, never contended by another connection.
//!
//! When the answer is complete before the body is, the rest of the body is read and dropped
//! (up to [`MAX_DISCARD`]; more closes the connection), as nginx discards it, so the next
//! request on the connection starts where it should.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::vocab::request_body::BoxError;

/// The largest piece of body read at once.
pub const MAX_PIECE: usize = 64 * 1024;
/// The most body bytes read and dropped after an answer that did not wait for them.
pub const MAX_DISCARD: u64 = 1024 * 1024;

/// What both sides share.
#[derive(Default)]
struct Shared {
    /// Read off the socket, not yet taken by the service.
    ready: Option<Bytes>,
    /// Still on the socket (or in the connection's buffer).
    left: u64,
    /// The service waits for a piece.
    reader: Option<Waker>,
    /// The connection waits for the service to take `ready`.
    feeder: Option<Waker>,
    /// The client closed before the end.
    cut: bool,
    /// Nobody will take more: the service dropped the body, or the answer is complete.
    abandoned: bool,
}

impl Shared {
    /// More is still to come than may be discarded, or the client cut the body.
    fn too_much_left(&self) -> bool {
        self.left > MAX_DISCARD || self.cut
    }
}

/// Keeps `cx`'s waker in `slot`, unless the one there already wakes the same task.
fn register(slot: &mut Option<Waker>, cx: &Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
}

/// The connection's end.
pub struct Feed(Arc<Mutex<Shared>>);

/// The service's end: the request body.
pub struct FedBody(Arc<Mutex<Shared>>);

/// A body of `length` bytes, its two ends.
pub fn channel(length: u64) -> (Feed, FedBody) {
    let shared = Arc::new(Mutex::new(Shared {
        left: length,
        ..Shared::default()
    }));
    (Feed(shared.clone()), FedBody(shared))
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while holding it leaves nothing half-done worth refusing.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the connection should do for the body now.
pub enum Need {
    /// Nothing: the body is complete, or waits for the service to take a piece.
    Nothing,
    /// Body bytes: give what the buffer holds ([`Feed::give`]), or read more.
    Bytes,
}

impl Feed {
    /// Whether the body has been read to its end (or dropped to it).
    pub fn is_done(&self) -> bool {
        let shared = lock(&self.0);
        shared.left == 0 && (shared.ready.is_none() || shared.abandoned)
    }

    /// What the body needs; registers `cx` to be woken when the service takes a piece.
    pub fn need(&self, cx: &Context<'_>) -> Need {
        let mut shared = lock(&self.0);
        if shared.left == 0 || shared.cut || (shared.abandoned && shared.left > MAX_DISCARD) {
            return Need::Nothing;
        }
        if shared.ready.is_some() && !shared.abandoned {
            register(&mut shared.feeder, cx);
            return Need::Nothing;
        }
        Need::Bytes
    }

    /// Hands the body what `buf` holds of it (dropped when it is abandoned).
    pub fn give(&self, buf: &mut BytesMut) {
        let mut shared = lock(&self.0);
        let n = usize::try_from(shared.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        if n == 0 {
            return;
        }
        let piece = buf.split_to(n).freeze();
        shared.left -= n as u64;
        if shared.abandoned {
            return;
        }
        shared.ready = Some(piece);
        if let Some(reader) = shared.reader.take() {
            reader.wake();
        }
    }

    /// Whether more of the body is still to come than an answer that does not wait for it
    /// would let the connection discard: the connection will likely close after the answer.
    pub fn more_than_discardable(&self) -> bool {
        lock(&self.0).too_much_left()
    }

    /// How many bytes to read for the body at most.
    pub fn read_room(&self) -> usize {
        let left = lock(&self.0).left;
        usize::try_from(left).unwrap_or(usize::MAX).min(MAX_PIECE)
    }

    /// The client closed before the end of the body.
    pub fn cut(&self) {
        let mut shared = lock(&self.0);
        shared.cut = true;
        if let Some(reader) = shared.reader.take() {
            reader.wake();
        }
    }

    /// The answer is complete: the rest of the body is not for the service any more. Whether
    /// what is left may be discarded (else the connection closes).
    pub fn abandon(&self) -> bool {
        let mut shared = lock(&self.0);
        shared.abandoned = true;
        shared.ready = None;
        if let Some(reader) = shared.reader.take() {
            reader.wake();
        }
        !shared.too_much_left()
    }
}

impl Body for FedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut shared = lock(&self.0);
        if shared.abandoned {
            return Poll::Ready(Some(Err("the answer ended before the request body".into())));
        }
        if let Some(piece) = shared.ready.take() {
            if let Some(feeder) = shared.feeder.take() {
                feeder.wake();
            }
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        if shared.cut {
            return Poll::Ready(Some(Err(
                "the client closed in the middle of the body".into()
            )));
        }
        if shared.left == 0 {
            return Poll::Ready(None);
        }
        register(&mut shared.reader, cx);
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let shared = lock(&self.0);
        shared.left == 0 && shared.ready.is_none() && !shared.cut
    }

    fn size_hint(&self) -> SizeHint {
        let shared = lock(&self.0);
        let ready = shared.ready.as_ref().map_or(0, |b| b.len() as u64);
        SizeHint::with_exact(shared.left + ready)
    }
}

impl Drop for FedBody {
    /// A body dropped before its end: the connection discards the rest.
    fn drop(&mut self) {
        let mut shared = lock(&self.0);
        shared.abandoned = true;
        shared.ready = None;
        if let Some(feeder) = shared.feeder.take() {
            feeder.wake();
        }
    }
}
