//! `limits_store: redis://host:port[/db]`: `rate_limit` and `x4xx_limit` counted across every
//! instance that names the same Redis. The GCRA of [`limiter`](super::limiter) runs atomically
//! in Redis (a Lua script on Redis's own clock, so instances need no common clock).
//!
//! **Local pre-check.** Per client and limit each instance keeps a view: how far ahead of now
//! the client's theoretical arrival time was when Redis last said, and how many requests this
//! instance admitted since that Redis has not been told (`unsynced`). Each instance keeps at most
//! `L = max(1, burst / (8 N))` unsynced (`N`: instances alive, each heartbeating in Redis). A
//! request is admitted here, with no round trip, when the view has room for it and for what
//! every other instance may have admitted unseen: `used + 1 + (N - 1) L <= burst`. Otherwise (a
//! client near its limit, or not seen for a while) it asks Redis, which first charges what this
//! instance admitted unseen, then decides. Every [`FLUSH`] the unsynced counts go to Redis in one
//! pipeline and the views are renewed.
//!
//! **Error bound.** Redis decides exactly on what it was told; what it was not told is at most
//! `L` per instance. So a client gets at most its limit plus `N L` in any window: for limits up
//! to `8 N` a second, its limit plus one request per instance (3 instances, `rate_limit: 10`: at
//! most 13 in a burst, against 30 with per-instance tables).
//!
//! **x4xx_limit.** 4xx answers are charged in Redis as they happen (off the request path); the
//! one that goes over the limit blocks the client on every instance, through a message on
//! [`BLOCKS`] that each instance follows and writes into its own table of strikes.
//!
//! **Redis slow or down.** A request waits for Redis at most [`ASK_DEADLINE`]; then it is
//! decided by this instance's own table (the limit holds per instance meanwhile), Redis is left
//! alone for a second, the incident logged once and counted
//! (`aralez_limits_store_errors_total`), and the first request after the pause asks again.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::limiter::{Rate, Slot, Strikes, Table, Tat, QUIET};
use crate::vocab::redis_link::{Incident, RedisLink};

/// How long a request waits for Redis before its own instance decides.
pub const ASK_DEADLINE: Duration = Duration::from_millis(5);
/// How often unsynced admissions go to Redis.
pub const FLUSH: Duration = Duration::from_millis(25);
/// How long a flush, a heartbeat or a 4xx charge may take.
const BACKGROUND_DEADLINE: Duration = Duration::from_millis(500);
/// A view older than this is not trusted: the next request asks Redis.
const VIEW_LIFETIME: Duration = Duration::from_secs(1);
/// The channel on which blocks of `x4xx_limit` go to every instance.
const BLOCKS: &str = "aralez:limits-blocks";
const INSTANCES: &str = "aralez:limits:instances";

/// GCRA in Redis. KEYS[1]: the counter. ARGV: emission and tolerance (µs), requests already
/// admitted elsewhere (charged whatever happens), 1 to ask for one more. Returns {admitted,
/// µs the arrival time is ahead of now}.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local emission = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
tat = tat + tonumber(ARGV[3]) * emission
local admitted = 0
if ARGV[4] == '1' and tat - now <= tonumber(ARGV[2]) then
  tat = tat + emission
  admitted = 1
end
if tat > now then
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
end
return {admitted, tat - now}
";

/// Heartbeat: this instance is alive; answers how many are (seen within 5 s).
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 5000)
redis.call('PEXPIRE', KEYS[1], 10000)
return redis.call('ZCARD', KEYS[1])
";

/// What this instance knows of one client's count under one limit.
#[derive(Clone, Copy, Debug)]
struct View {
    /// When the client's theoretical arrival time is, on the table's clock (ns).
    tat: u64,
    /// When Redis last said (ns).
    synced_at: u64,
    /// Admitted here since, not yet told to Redis.
    unsynced: u32,
    per_second: u32,
    ip: IpAddr,
    scope: u64,
}

impl Slot for View {
    fn is_idle(&self, now: u64) -> bool {
        self.tat <= now && self.unsynced == 0
    }
}

/// A limit's counter for one client: who, under which limit, at which rate.
#[derive(Clone, Copy, Debug)]
pub struct Counter {
    pub ip: IpAddr,
    pub scope: u64,
    pub rate: Rate,
}

impl Counter {
    fn redis_key(&self, kind: &str) -> String {
        format!("aralez:{kind}:{:x}:{}", self.scope, self.ip)
    }
}

/// What the pre-check decided.
pub enum Verdict {
    Admit,
    Refuse,
    /// Redis must decide: the counter and what this instance admitted unseen.
    Ask(Counter, u32),
}

/// Counts of what the shared limits did, for `/metrics`.
#[derive(Debug, Default)]
pub struct LimitCounters {
    pub local: AtomicU64,
    pub asked: AtomicU64,
    pub fell_back: AtomicU64,
}

/// The shared limits of one process: the link to Redis, the views, the local tables it falls
/// back on, and the keys waiting for the next flush.
pub struct SharedLimits {
    link: RedisLink,
    views: Table<View>,
    /// Keys of views with unsynced admissions.
    pending: Mutex<Vec<u64>>,
    requests: Arc<Table<Tat>>,
    strikes: Arc<Table<Strikes>>,
    instances: AtomicU32,
    id: String,
    pub counters: LimitCounters,
}

impl std::fmt::Debug for SharedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimits").finish_non_exhaustive()
    }
}

impl SharedLimits {
    /// Limits counted in the Redis at `url`, falling back on this process's `requests` and
    /// `strikes` tables; `slots` connections (one per worker and one for the background).
    pub fn new(
        url: &str,
        slots: usize,
        requests: Arc<Table<Tat>>,
        strikes: Arc<Table<Strikes>>,
    ) -> Result<SharedLimits, redis::RedisError> {
        let incident = Incident {
            user: "limits_store",
            meanwhile: "limits are counted per instance",
        };
        Ok(SharedLimits {
            link: RedisLink::new(url, slots + 1, incident)?,
            views: Table::new(),
            pending: Mutex::new(Vec::new()),
            requests,
            strikes,
            instances: AtomicU32::new(1),
            id: format!(
                "{:016x}",
                ahash::RandomState::new().hash_one(std::process::id())
            ),
            counters: LimitCounters::default(),
        })
    }

    /// Instances seen alive in the last heartbeat (at least this one).
    fn instances(&self) -> u64 {
        u64::from(self.instances.load(Ordering::Relaxed).max(1))
    }

    /// Unsynced admissions an instance may hold for one client.
    fn allowance(&self, rate: Rate) -> u64 {
        (u64::from(rate.per_second) / (8 * self.instances())).max(1)
    }

    /// The pre-check of one request: admitted here, refused by the fallback table, or a
    /// question for Redis.
    pub fn check(&self, counter: Counter) -> Verdict {
        if self.link.is_down() {
            return self.fall_back(counter);
        }
        let Counter { ip, scope, rate } = counter;
        let key = self.views.key((ip, scope));
        let now = self.views.now();
        let room = self.allowance(rate);
        let others = (self.instances() - 1) * room;
        let lifetime = VIEW_LIFETIME.as_nanos() as u64;
        let (verdict, first_unsynced) = self.views.update(key, now, |slot| match slot {
            Some(mut v) if now.saturating_sub(v.synced_at) < lifetime => {
                let used = v.tat.saturating_sub(now).div_ceil(rate.emission_ns());
                let fits = used + u64::from(v.unsynced) + 1 + others <= u64::from(rate.per_second);
                if fits && u64::from(v.unsynced) < room {
                    v.unsynced += 1;
                    (Some(v), (Verdict::Admit, v.unsynced == 1))
                } else {
                    let unseen = std::mem::take(&mut v.unsynced);
                    // What goes to Redis with the question counts here until Redis answers, the
                    // question itself as if admitted: the requests of the same instant found
                    // the room it takes, and were admitted here one in two (twice the limit in
                    // a burst). Too much counted only sends more questions to Redis.
                    let asked = u64::from(unseen) + 1;
                    v.tat = v.tat.max(now) + asked * rate.emission_ns();
                    (Some(v), (Verdict::Ask(counter, unseen), false))
                }
            }
            Some(v) => {
                let unseen = v.unsynced;
                (None, (Verdict::Ask(counter, unseen), false))
            }
            None => (None, (Verdict::Ask(counter, 0), false)),
        });
        if first_unsynced {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(key);
        }
        if matches!(verdict, Verdict::Admit) {
            self.counters.local.fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    /// Redis's decision on one request (what this instance admitted unseen charged first);
    /// this instance's own table decides when Redis does not answer within [`ASK_DEADLINE`].
    pub async fn ask(&self, counter: Counter, unseen: u32, slot: usize) -> bool {
        self.counters.asked.fetch_add(1, Ordering::Relaxed);
        let mut cmd = redis::pipe();
        gcra(
            &mut cmd,
            &counter.redis_key("rl"),
            counter.rate,
            unseen,
            true,
        );
        match self
            .link
            .run::<Vec<(u8, u64)>>(slot, ASK_DEADLINE, &cmd)
            .await
        {
            Some(replies) if !replies.is_empty() => {
                let (admitted, ahead_us) = replies[0];
                self.renew(counter, ahead_us);
                admitted == 1
            }
            _ => matches!(self.fall_back(counter), Verdict::Admit),
        }
    }

    fn fall_back(&self, c: Counter) -> Verdict {
        self.counters.fell_back.fetch_add(1, Ordering::Relaxed);
        let admitted = self
            .requests
            .admit(self.requests.key((c.ip, c.scope)), c.rate);
        if admitted {
            Verdict::Admit
        } else {
            Verdict::Refuse
        }
    }

    /// The view after Redis said the client's arrival time is `ahead_us` ahead of now.
    fn renew(&self, c: Counter, ahead_us: u64) {
        let key = self.views.key((c.ip, c.scope));
        let now = self.views.now();
        let answered = now.saturating_add(ahead_us.saturating_mul(1000));
        self.views.update(key, now, |slot| {
            let unsynced = slot.map_or(0, |v| v.unsynced);
            // Answers to questions asked together come in any order: an earlier one's lower
            // time must not undo a later one's, nor what questions still out have counted.
            let tat = slot.map_or(answered, |v| v.tat.max(answered));
            let view = View {
                tat,
                synced_at: now,
                unsynced,
                per_second: c.rate.per_second,
                ip: c.ip,
                scope: c.scope,
            };
            (Some(view), ())
        });
    }

    /// Tells Redis what was admitted here since the last flush, in one pipeline, and renews
    /// those views.
    async fn flush(&self) {
        // While Redis is down the keys wait (their counts go with the next flush or ask).
        if self.link.is_down() {
            return;
        }
        let keys = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if keys.is_empty() {
            return;
        }
        let now = self.views.now();
        let mut told = Vec::with_capacity(keys.len());
        let mut cmd = redis::pipe();
        for key in keys {
            let taken = self.views.update(key, now, |slot| match slot {
                Some(mut v) if v.unsynced > 0 => {
                    let unseen = std::mem::take(&mut v.unsynced);
                    (Some(v), Some((v, unseen)))
                }
                other => (other, None),
            });
            let Some((v, unseen)) = taken else { continue };
            let Some(rate) = Rate::per_second(v.per_second) else {
                continue;
            };
            let counter = Counter {
                ip: v.ip,
                scope: v.scope,
                rate,
            };
            gcra(&mut cmd, &counter.redis_key("rl"), rate, unseen, false);
            told.push(counter);
        }
        if told.is_empty() {
            return;
        }
        let slot = self.link.last_slot();
        let replies = self
            .link
            .run::<Vec<(u8, u64)>>(slot, BACKGROUND_DEADLINE, &cmd);
        if let Some(replies) = replies.await {
            for (counter, (_, ahead_us)) in told.into_iter().zip(replies) {
                self.renew(counter, ahead_us);
            }
        }
    }

    /// Charges a 4xx answer to the client in Redis; the one over the limit blocks the client
    /// on every instance.
    pub fn record_4xx(self: &Arc<Self>, counter: Counter) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.link.is_down() {
            return;
        }
        let limits = self.clone();
        runtime.spawn(async move {
            let mut cmd = redis::pipe();
            gcra(&mut cmd, &counter.redis_key("x4xx"), counter.rate, 0, true);
            let slot = limits.link.last_slot();
            let replies = limits
                .link
                .run::<Vec<(u8, u64)>>(slot, BACKGROUND_DEADLINE, &cmd);
            // Over the limit, or the answer that filled it (as the local table counts).
            let tolerance_us = counter.rate.tolerance_ns() / 1000;
            let filled =
                |&(admitted, ahead_us): &(u8, u64)| admitted == 0 || ahead_us > tolerance_us;
            if replies
                .await
                .as_deref()
                .is_some_and(|r| r.iter().any(filled))
            {
                let mut publish = redis::pipe();
                let block = format!("{:x} {} {}", counter.scope, counter.ip, QUIET.as_millis());
                publish.cmd("PUBLISH").arg(BLOCKS).arg(block).ignore();
                limits
                    .link
                    .run::<()>(slot, BACKGROUND_DEADLINE, &publish)
                    .await;
            }
        });
    }

    /// A block another instance published: the client is refused here too.
    fn blocked(&self, message: &str) {
        let mut parts = message.split(' ');
        let scope = parts.next().and_then(|s| u64::from_str_radix(s, 16).ok());
        let ip = parts.next().and_then(|s| s.parse::<IpAddr>().ok());
        let ms = parts.next().and_then(|s| s.parse::<u64>().ok());
        if let (Some(scope), Some(ip), Some(ms)) = (scope, ip, ms) {
            let key = self.strikes.key((ip, scope));
            self.strikes.block(key, Duration::from_millis(ms));
        }
    }

    /// The background work, on `runtime`: the flush every [`FLUSH`], the heartbeat every
    /// second, and following [`BLOCKS`].
    pub fn start(self: &Arc<Self>, runtime: &tokio::runtime::Handle) {
        let limits = self.clone();
        runtime.spawn(async move {
            limits.link.warm(BACKGROUND_DEADLINE).await;
            let mut flush = tokio::time::interval(FLUSH);
            flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut beats = 0u32;
            loop {
                flush.tick().await;
                limits.flush().await;
                beats += 1;
                if beats % 40 == 1 {
                    limits.heartbeat().await;
                }
            }
        });
        let limits = self.clone();
        runtime.spawn(async move {
            let message = |text: &str| limits.blocked(text);
            limits.link.follow(BLOCKS, || {}, message).await;
        });
    }

    async fn heartbeat(&self) {
        let mut cmd = redis::pipe();
        cmd.cmd("EVAL")
            .arg(HEARTBEAT)
            .arg(1)
            .arg(INSTANCES)
            .arg(&self.id);
        let slot = self.link.last_slot();
        if let Some((alive,)) = self
            .link
            .run::<(u32,)>(slot, BACKGROUND_DEADLINE, &cmd)
            .await
        {
            self.instances.store(alive.max(1), Ordering::Relaxed);
        }
    }

    /// The series of `/metrics`.
    pub fn render_prometheus(&self, out: &mut String) {
        use std::fmt::Write as _;
        let c = &self.counters;
        let series = [
            ("local", "requests admitted without asking Redis", &c.local),
            ("asked", "requests that asked Redis", &c.asked),
            (
                "fell_back",
                "requests decided by the instance's own table (Redis down or slow)",
                &c.fell_back,
            ),
            (
                "errors",
                "Redis commands that failed or timed out",
                &self.link.errors,
            ),
        ];
        for (name, help, value) in series {
            let name = format!("aralez_limits_store_{name}_total");
            let value = value.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "# HELP {name} Shared limits: {help}.\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let alive = self.instances();
        let _ = writeln!(out, "# HELP aralez_limits_store_instances Instances sharing the limits (heartbeats).\n# TYPE aralez_limits_store_instances gauge\naralez_limits_store_instances {alive}");
    }
}

/// One run of the GCRA script for `key` in `cmd`.
fn gcra(cmd: &mut redis::Pipeline, key: &str, rate: Rate, unseen: u32, ask: bool) {
    cmd.cmd("EVAL")
        .arg(GCRA)
        .arg(1)
        .arg(key)
        .arg(rate.emission_ns() / 1000)
        .arg(rate.tolerance_ns() / 1000)
        .arg(unseen)
        .arg(u8::from(ask));
}
