//! The shared tier of `storage: redis://host:port[/db]`: every stored answer also goes to
//! Redis (one hash per key, a field per `Vary` variant, in the disk tier's checksummed format),
//! so several aralez instances share what one of them fetched. Memory stays the first tier.
//!
//! Redis never holds a request up for long: a lookup waits at most [`LOOKUP_DEADLINE`]; on an
//! error or a timeout the tier is skipped for a second (the request is served from the
//! backend, `X-Cache-Status: BYPASS`), the incident is logged once and counted, and the next
//! request after that tries again. Writes run in tasks of their own. Each worker has its own
//! multiplexed connection, made on first use; the admin API has one more.
//!
//! What one instance drops (a purge, an unsafe method's invalidation) it also publishes on
//! [`DROPS`]; every instance listens there and drops the same from its memory tier, which would
//! otherwise go on serving it. After the subscription was lost (Redis restarted or unreachable)
//! an instance empties its memory tier once subscribed again, since messages may have been
//! missed meanwhile: Redis still holds what it dropped.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::disk;
use super::entry::Entry;
use crate::vocab::redis_link::{Incident, RedisLink};

/// How long a request waits for Redis before it goes to the backend without it.
pub const LOOKUP_DEADLINE: Duration = Duration::from_millis(50);
/// How long a write or a purge may take.
const WRITE_DEADLINE: Duration = Duration::from_secs(1);
/// Prefix of every key aralez writes.
const PREFIX: &str = "aralez:cache:";
/// The channel of drops, which every instance follows.
const DROPS: &str = "aralez:cache-drops";

/// What an instance dropped, and every other must drop from memory.
#[derive(Debug, PartialEq)]
pub enum Dropped {
    Key(String),
    /// Every key of `host` under the path `prefix`.
    Under {
        host: String,
        prefix: String,
    },
    /// Everything: drops may have been missed.
    All,
}

impl Dropped {
    fn message(&self) -> String {
        match self {
            Dropped::Key(key) => format!("key {key}"),
            Dropped::Under { host, prefix } => format!("under {host} {prefix}"),
            Dropped::All => "all".to_string(),
        }
    }

    /// A message of [`message`](Self::message)'s form (hosts have no spaces; keys and prefixes
    /// are the rest of the line).
    fn parse(text: &str) -> Option<Dropped> {
        if text == "all" {
            return Some(Dropped::All);
        }
        let (kind, rest) = text.split_once(' ')?;
        match kind {
            "key" => Some(Dropped::Key(rest.to_string())),
            "under" => {
                let (host, prefix) = rest.split_once(' ')?;
                Some(Dropped::Under {
                    host: host.to_string(),
                    prefix: prefix.to_string(),
                })
            }
            _ => None,
        }
    }
}

/// What a lookup in Redis found.
pub enum Fetched {
    Found(Vec<Entry>),
    Missing,
    /// Down, slow or refusing: the request goes on without the tier.
    Unreachable,
}

pub struct RemoteTier {
    link: RedisLink,
    /// Lookups that found the key.
    pub reads: AtomicU64,
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier").finish_non_exhaustive()
    }
}

impl RemoteTier {
    /// The tier for `url` with a connection slot per worker and one for the admin API;
    /// connects on first use.
    pub fn new(url: &str, workers: usize) -> Result<Arc<RemoteTier>, ::redis::RedisError> {
        let incident = Incident {
            user: "cache",
            meanwhile: "requests bypass it",
        };
        Ok(Arc::new(RemoteTier {
            link: RedisLink::new(url, workers + 1, incident)?,
            reads: AtomicU64::new(0),
        }))
    }

    /// The admin API's slot.
    pub fn admin_slot(&self) -> usize {
        self.link.last_slot()
    }

    /// Commands that failed or timed out.
    pub fn errors(&self) -> u64 {
        self.link.errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn run<T: ::redis::FromRedisValue>(
        &self,
        slot: usize,
        deadline: Duration,
        cmd: &::redis::Pipeline,
    ) -> Option<T> {
        self.link.run(slot, deadline, cmd).await
    }

    /// The variants stored for `key`.
    pub async fn get(&self, slot: usize, key: &str) -> Fetched {
        let mut cmd = ::redis::pipe();
        cmd.cmd("HGETALL").arg(redis_key(key));
        let Some((fields,)) = self
            .run::<(Vec<(Vec<u8>, Vec<u8>)>,)>(slot, LOOKUP_DEADLINE, &cmd)
            .await
        else {
            return Fetched::Unreachable;
        };
        let entries: Vec<Entry> = fields
            .iter()
            .filter_map(|(_, value)| disk::decode(value))
            .filter(|(stored_key, ..)| stored_key == key)
            .map(|(_, entry, _)| entry)
            .collect();
        if entries.is_empty() {
            Fetched::Missing
        } else {
            Fetched::Found(entries)
        }
    }

    /// Writes `entry` in a task of its own (when there is a runtime to run it).
    pub fn put(self: &Arc<Self>, slot: usize, key: &str, entry: Arc<Entry>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.link.is_down() {
            return;
        }
        let (tier, key) = (self.clone(), key.to_string());
        runtime.spawn(async move {
            let value = disk::encode(&key, &entry);
            let keep = entry.fresh_for + entry.stale_while_revalidate.max(entry.stale_if_error);
            // Kept past its freshness for revalidation; at most a week.
            let ttl = (keep + Duration::from_secs(600)).min(Duration::from_secs(7 * 86_400));
            let mut cmd = ::redis::pipe();
            cmd.cmd("HSET")
                .arg(redis_key(&key))
                .arg(disk::file_name(&key, &entry))
                .arg(value)
                .ignore()
                .cmd("PEXPIRE")
                .arg(redis_key(&key))
                .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
                .ignore();
            tier.run::<()>(slot, WRITE_DEADLINE, &cmd).await;
        });
    }

    /// Drops `key`'s variants, here and (through [`DROPS`]) in every instance's memory;
    /// returns how many there were (`None`: Redis did not answer).
    pub async fn remove(&self, slot: usize, key: &str) -> Option<usize> {
        let mut cmd = ::redis::pipe();
        cmd.cmd("HLEN")
            .arg(redis_key(key))
            .cmd("DEL")
            .arg(redis_key(key))
            .ignore()
            .cmd("PUBLISH")
            .arg(DROPS)
            .arg(Dropped::Key(key.to_string()).message())
            .ignore();
        self.run::<(usize,)>(slot, WRITE_DEADLINE, &cmd)
            .await
            .map(|(n,)| n)
    }

    /// Drops, in a task of its own, `key`'s variants (an unsafe method's invalidation).
    pub fn remove_later(self: &Arc<Self>, slot: usize, key: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tier, key) = (self.clone(), key.to_string());
        runtime.spawn(async move { tier.remove(slot, &key).await });
    }

    /// Every key aralez stored in Redis, for a purge by prefix (SCAN, never KEYS); `None` when
    /// Redis did not answer every step.
    pub async fn keys(&self, slot: usize) -> Option<Vec<String>> {
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = ::redis::pipe();
            cmd.cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{PREFIX}*"))
                .arg("COUNT")
                .arg(1000);
            let ((next, batch),) = self
                .run::<((u64, Vec<String>),)>(slot, WRITE_DEADLINE, &cmd)
                .await?;
            keys.extend(
                batch
                    .into_iter()
                    .filter_map(|k| k.strip_prefix(PREFIX).map(str::to_string)),
            );
            if next == 0 || keys.len() > 1_000_000 {
                return Some(keys);
            }
            cursor = next;
        }
    }

    /// Tells every instance to drop what `dropped` names from memory; false when Redis did not
    /// answer.
    pub async fn publish(&self, slot: usize, dropped: &Dropped) -> bool {
        let mut cmd = ::redis::pipe();
        cmd.cmd("PUBLISH")
            .arg(DROPS)
            .arg(dropped.message())
            .ignore();
        self.run::<()>(slot, WRITE_DEADLINE, &cmd).await.is_some()
    }

    /// Follows [`DROPS`] for as long as the process runs, handing each drop to `on_drop`,
    /// and [`Dropped::All`] each time it subscribes, the first time included: drops published
    /// before a subscription is in place are not delivered, and what the memory tier took in
    /// meanwhile may be one of them (it is read again from Redis).
    pub async fn listen(self: Arc<Self>, on_drop: impl Fn(Dropped) + Send + 'static) {
        let message = |text: &str| {
            if let Some(dropped) = Dropped::parse(text) {
                on_drop(dropped);
            }
        };
        let subscribed = || {
            on_drop(Dropped::All);
            tracing::info!("cache: following other instances' drops through Redis (the memory tier starts empty: drops may have been missed)");
        };
        self.link.follow(DROPS, subscribed, message).await;
    }
}

fn redis_key(key: &str) -> String {
    [PREFIX, key].concat()
}

#[cfg(test)]
mod tests {
    use super::Dropped;

    #[test]
    fn drops_read_back_as_written() {
        let all = [
            Dropped::Key("http://a.test/x?q=a b".into()),
            Dropped::Under {
                host: "a.test".into(),
                prefix: "/p q".into(),
            },
            Dropped::All,
        ];
        for dropped in all {
            assert_eq!(Dropped::parse(&dropped.message()), Some(dropped));
        }
        assert_eq!(Dropped::parse("keys x"), None);
        assert_eq!(Dropped::parse("under a.test"), None);
    }
}
