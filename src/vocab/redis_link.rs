//! One Redis server as the proxy's shared state uses it (the cache's `redis://` tier,
//! `limits_store`): a multiplexed connection per slot (a worker's, or the admin API's), made on
//! first use (or [`warm`](RedisLink::warm)ed at start); every command within a deadline; after
//! an error, or [`TIMEOUTS_IN_A_ROW`] timeouts, the server is left alone for [`RETRY_AFTER`]
//! (callers go on without it), the incident logged once and counted, and the first command after
//! the pause tries again. A single late answer costs only the command that waited for it, and
//! no command waits past its deadline, a connection made on the way included. A kept
//! connection the server dropped (Redis restarted) is replaced once, at once, within the same
//! deadline.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, FromRedisValue, Pipeline, RedisError};
use tokio::time::Instant;

/// How long Redis is left alone after it failed.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Timeouts in a row that count as Redis failing (one late answer is a busy moment).
pub const TIMEOUTS_IN_A_ROW: u32 = 3;

/// What the log says of an incident: who uses Redis, and what happens meanwhile.
#[derive(Clone, Copy, Debug)]
pub struct Incident {
    pub user: &'static str,
    pub meanwhile: &'static str,
}

pub struct RedisLink {
    client: Client,
    /// One connection per slot.
    conns: Box<[Mutex<Option<MultiplexedConnection>>]>,
    started: Instant,
    /// Milliseconds since `started` until which Redis is skipped.
    down_until: AtomicU64,
    in_incident: AtomicBool,
    timeouts: std::sync::atomic::AtomicU32,
    incident: Incident,
    /// Commands that failed or timed out.
    pub errors: AtomicU64,
}

impl std::fmt::Debug for RedisLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLink")
            .field("user", &self.incident.user)
            .finish_non_exhaustive()
    }
}

/// The one line saying Redis is unreachable: the client's errors quote what the server said,
/// newlines and all, which are escaped (a reply could otherwise forge log lines).
fn unreachable_line(incident: &Incident, why: &str) -> String {
    let Incident { user, meanwhile } = incident;
    let why = why.escape_debug();
    format!("{user}: Redis unreachable ({why}); {meanwhile} until it answers")
}

impl RedisLink {
    /// A link to `url` with `slots` connection slots; connects on first use.
    pub fn new(url: &str, slots: usize, incident: Incident) -> Result<RedisLink, RedisError> {
        Ok(RedisLink {
            client: Client::open(url)?,
            conns: (0..slots.max(1)).map(|_| Mutex::new(None)).collect(),
            started: Instant::now(),
            down_until: AtomicU64::new(0),
            in_incident: AtomicBool::new(false),
            timeouts: std::sync::atomic::AtomicU32::new(0),
            incident,
            errors: AtomicU64::new(0),
        })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The last slot (the admin API's, by convention).
    pub fn last_slot(&self) -> usize {
        self.conns.len() - 1
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Redis failed less than [`RETRY_AFTER`] ago.
    pub fn is_down(&self) -> bool {
        self.now_ms() < self.down_until.load(Ordering::Relaxed)
    }

    fn slot(&self, slot: usize) -> MutexGuard<'_, Option<MultiplexedConnection>> {
        let slot = &self.conns[slot.min(self.conns.len() - 1)];
        slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot's connection, made now if there is none (by `until`); true when it was made
    /// before (it may have been dropped by the server since).
    async fn conn(&self, slot: usize, until: Instant) -> Option<(MultiplexedConnection, bool)> {
        if self.is_down() {
            return None;
        }
        if let Some(conn) = self.slot(slot).clone() {
            return Some((conn, true));
        }
        // No response timeout of the client's own: a late answer is the command's deadline's
        // (`run`), counted among timeouts, not an I/O error that drops the connection.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(until.saturating_duration_since(Instant::now())))
            .set_response_timeout(None);
        let made = self
            .client
            .get_multiplexed_async_connection_with_config(&config);
        match tokio::time::timeout_at(until, made).await {
            Ok(Ok(conn)) => {
                *self.slot(slot) = Some(conn.clone());
                Some((conn, false))
            }
            Ok(Err(e)) => self.failed(slot, &e.to_string()),
            Err(_) => self.failed(slot, "timed out connecting"),
        }
    }

    /// Marks Redis down for [`RETRY_AFTER`]; logs once per incident.
    fn failed<T>(&self, slot: usize, why: &str) -> Option<T> {
        *self.slot(slot) = None;
        self.errors.fetch_add(1, Ordering::Relaxed);
        let until = self.now_ms() + u64::try_from(RETRY_AFTER.as_millis()).unwrap_or(1000);
        self.down_until.store(until, Ordering::Relaxed);
        if !self.in_incident.swap(true, Ordering::Relaxed) {
            tracing::warn!("{}", unreachable_line(&self.incident, why));
        }
        None
    }

    /// A command that waited past its deadline: counted; Redis is failing only after
    /// [`TIMEOUTS_IN_A_ROW`].
    fn timed_out<T>(&self, slot: usize) -> Option<T> {
        if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_IN_A_ROW {
            self.timeouts.store(0, Ordering::Relaxed);
            return self.failed(slot, "timed out");
        }
        self.errors.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Makes every slot's connection now (at start), each within `deadline`.
    pub async fn warm(&self, deadline: Duration) {
        for slot in 0..self.conns.len() {
            if self.conn(slot, Instant::now() + deadline).await.is_none() {
                return;
            }
        }
    }

    fn succeeded(&self) {
        self.timeouts.store(0, Ordering::Relaxed);
        if self.in_incident.swap(false, Ordering::Relaxed) {
            tracing::info!("{}: Redis answers again", self.incident.user);
        }
    }

    /// Runs `cmd` on the slot's connection within `deadline`, a connection made or made again
    /// included; `None` when Redis is down, slow or refusing (then it is left alone for
    /// [`RETRY_AFTER`]).
    pub async fn run<T: FromRedisValue>(
        &self,
        slot: usize,
        deadline: Duration,
        cmd: &Pipeline,
    ) -> Option<T> {
        let until = Instant::now() + deadline;
        for _ in 0..2 {
            let (mut conn, kept) = self.conn(slot, until).await?;
            match tokio::time::timeout_at(until, cmd.query_async::<T>(&mut conn)).await {
                Ok(Ok(value)) => {
                    self.succeeded();
                    return Some(value);
                }
                Ok(Err(e)) if e.is_timeout() => return self.timed_out(slot),
                Ok(Err(e)) if kept && (e.is_connection_dropped() || e.is_io_error()) => {
                    *self.slot(slot) = None;
                }
                Ok(Err(e)) => return self.failed(slot, &e.to_string()),
                Err(_) => return self.timed_out(slot),
            }
        }
        self.failed(slot, "connection dropped")
    }

    /// Follows `channel` for as long as the process runs, `on_message` getting each message's
    /// text. Subscribes again [`RETRY_AFTER`] after losing the channel, and runs
    /// `on_subscribed` each time the subscription is made (messages may have been missed).
    pub async fn follow(&self, channel: &str, on_subscribed: impl Fn(), on_message: impl Fn(&str)) {
        use futures_util::StreamExt as _;
        loop {
            let subscribed = tokio::time::timeout(RETRY_AFTER, async {
                let mut pubsub = self.client.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, RedisError>(pubsub)
            });
            if let Ok(Ok(pubsub)) = subscribed.await {
                on_subscribed();
                let mut messages = pubsub.into_on_message();
                while let Some(msg) = messages.next().await {
                    if let Ok(text) = msg.get_payload::<String>() {
                        on_message(&text);
                    }
                }
                let user = self.incident.user;
                tracing::warn!("{user}: lost Redis channel `{channel}`; subscribing again every {RETRY_AFTER:?}");
            }
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A Redis that answers `+OK` to each command while `answering` says so, and reads the
    /// rest without a word; returns its URL.
    async fn fake_redis(answering: Arc<AtomicBool>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let answering = answering.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        let commands = buf[..n].iter().filter(|&&b| b == b'*').count();
                        if answering.load(Ordering::Relaxed) {
                            let answer = "+OK\r\n".repeat(commands);
                            if stream.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        url
    }

    /// A Redis that stops answering costs each command its deadline once (the client's own
    /// response timeout made it an I/O error: the connection was dropped and the command sent
    /// again on a new one, for a second deadline), and only three late answers in a row are an
    /// incident (a first command's late answer was one at once).
    #[tokio::test(start_paused = true)]
    async fn a_late_answer_costs_one_deadline_and_three_make_an_incident() {
        let answering = Arc::new(AtomicBool::new(true));
        let url = fake_redis(answering.clone()).await;
        let incident = Incident {
            user: "test",
            meanwhile: "nothing",
        };
        let link = RedisLink::new(&url, 1, incident).unwrap();
        let deadline = Duration::from_millis(50);
        let mut ping = ::redis::pipe();
        ping.cmd("PING");
        let answer = link.run::<(String,)>(0, deadline, &ping).await;
        assert_eq!(answer, Some(("OK".to_string(),)));
        answering.store(false, Ordering::Relaxed);
        for late in 1..=TIMEOUTS_IN_A_ROW {
            assert!(!link.is_down(), "down after {} late answers", late - 1);
            let started = Instant::now();
            let answer = link.run::<(String,)>(0, deadline, &ping).await;
            assert_eq!(answer, None);
            assert_eq!(started.elapsed(), deadline, "late answer {late}");
        }
        assert!(link.is_down(), "three late answers are an incident");
    }

    #[test]
    fn a_redis_error_is_logged_on_one_line() {
        let incident = Incident {
            user: "limits_store",
            meanwhile: "each instance counts alone",
        };
        let why = "Parse error at 1\nUnexpected `84`\n2026-12-06T00:00:00Z  INFO forged";
        let line = unreachable_line(&incident, why);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("Parse error at 1\\nUnexpected"), "{line}");
    }
}
