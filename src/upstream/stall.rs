//! A deadline on a backend's response body that stops coming: once the head is in, the body
//! is cut when nothing more arrives for the response timeout while the client waits for it
//! (nginx's `proxy_read_timeout` between two reads, HAProxy's `timeout server`). Without it a
//! backend that hangs mid-body held the client's connection, and its own, for as long as the
//! client waited. The clock is read only when a read has to wait, not for each piece.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The body's stall deadline, armed when a read waits and disarmed by the next piece. One
/// pointer: it sits in every response body hyper's client reads, and the type that holds it is
/// every response's body, moved whole through the layers above (16 bytes here cost 80
/// instructions a request, callgrind, even for answers the inline client reads).
pub struct StallTimer(Box<Stall>);

struct Stall {
    /// Allocated at the first wait; most bodies arrive whole with their head.
    sleep: Option<Pin<Box<Sleep>>>,
    limit: Duration,
    waiting: bool,
}

impl StallTimer {
    pub fn new(limit: Duration) -> StallTimer {
        StallTimer(Box::new(Stall {
            sleep: None,
            limit,
            waiting: false,
        }))
    }

    /// After a poll of the body that gave `ready`: whether the body has now stalled past the
    /// limit. A pending poll arms the deadline (if this wait is new) and registers `cx` with it.
    pub fn stalled(&mut self, ready: bool, cx: &mut Context<'_>) -> bool {
        let stall = &mut *self.0;
        if ready {
            stall.waiting = false;
            return false;
        }
        if !stall.waiting {
            stall.waiting = true;
            let at = Instant::now() + stall.limit;
            match &mut stall.sleep {
                Some(sleep) => sleep.as_mut().reset(at),
                None => stall.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        stall
            .sleep
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }

    /// The error a stalled body ends with.
    pub fn error(&self) -> String {
        format!(
            "the backend sent no more of the body for {:?}",
            self.0.limit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_stays_small() {
        assert_eq!(std::mem::size_of::<StallTimer>(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_stalls_after_the_limit_without_a_piece() {
        let limit = Duration::from_secs(60);
        let mut timer = StallTimer::new(limit);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(!timer.stalled(false, &mut cx), "a wait begins");
        tokio::time::advance(limit - Duration::from_secs(1)).await;
        assert!(!timer.stalled(false, &mut cx));
        // A piece came: the next wait has the whole limit again.
        assert!(!timer.stalled(true, &mut cx));
        assert!(!timer.stalled(false, &mut cx));
        tokio::time::advance(limit - Duration::from_secs(1)).await;
        assert!(
            !timer.stalled(false, &mut cx),
            "the limit runs from the last piece"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(timer.stalled(false, &mut cx));
    }
}
