//! main.yaml's `cache:` block (Aralez 0.95's keys, SPEC §14): where responses are kept and how
//! much. Only parsing and validation live here; the cache itself is `layers::cache`.

use std::path::PathBuf;
use std::time::Duration;

use super::reader::{join, Reader};
use super::yaml::{Node, Value};

/// Where cached responses are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Storage {
    Memory,
    /// Memory plus files under `file_path` (Aralez's `hybrid`), read back after a restart.
    Hybrid,
    /// `redis://host:port[/db]`: shared by every instance that names it, memory in front.
    Redis(String),
}

/// The `cache:` block with Aralez 0.95's defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    pub storage: Storage,
    /// `mem_size_mb`: what the memory tier holds at most, in bytes.
    pub mem_size: u64,
    /// `file_size_mb`: what the disk tier holds at most, in bytes.
    pub file_size: u64,
    pub file_path: PathBuf,
    /// `item_max_size` (MB): a larger body is streamed through and not kept.
    pub item_max_size: u64,
    pub flush_interval: Duration,
    /// Freshness for 200, 301 and 404 responses that give none of their own.
    pub ttl: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            storage: Storage::Memory,
            mem_size: 64 * MB,
            file_size: 512 * MB,
            file_path: PathBuf::from("/tmp/aralez_cache"),
            item_max_size: 5 * MB,
            flush_interval: Duration::from_secs(60),
            ttl: Duration::from_secs(300),
        }
    }
}

const MB: u64 = 1024 * 1024;

const KEYS: &[&str] = &[
    "storage",
    "mem_size_mb",
    "file_size_mb",
    "file_path",
    "item_max_size",
    "flush_interval",
    "ttl",
];

/// Reads the `cache:` block. `None` when a value is wrong (each error already reported).
pub fn read_cache(block: &Node, r: &mut Reader) -> Option<CacheConfig> {
    let mut cfg = CacheConfig::default();
    if matches!(block.value, Value::Null) {
        let why = "says nothing (every key under it left out or commented out): the cache is on, with its defaults (64 MB in memory, ttl 300 s); remove the key for no cache";
        r.warn(block.pos, "cache", why);
    }
    let entries = r.map(block, "cache")?;
    let mut ok = true;
    for (key, value) in entries {
        let path = join("cache", &key.name);
        let p = path.as_str();
        let megabytes = |r: &mut Reader, max: u64| r.uint(value, p, 1, max).map(|n| n * MB);
        let read = match key.name.as_str() {
            "storage" => read_storage(value, p, r).map(|s| cfg.storage = s),
            "mem_size_mb" => megabytes(r, 1024 * 1024).map(|n| cfg.mem_size = n),
            "file_size_mb" => megabytes(r, 1024 * 1024 * 1024).map(|n| cfg.file_size = n),
            "file_path" => r
                .non_empty_string(value, p)
                .map(|s| cfg.file_path = PathBuf::from(s)),
            "item_max_size" => megabytes(r, 4096).map(|n| cfg.item_max_size = n),
            "flush_interval" => r
                .uint(value, p, 1, 86_400)
                .map(|s| cfg.flush_interval = Duration::from_secs(s)),
            "ttl" => r
                .uint(value, p, 1, 365 * 86_400)
                .map(|s| cfg.ttl = Duration::from_secs(s)),
            _ => {
                r.unknown_key(key, p, KEYS);
                Some(())
            }
        };
        ok &= read.is_some();
    }
    if cfg.item_max_size > cfg.mem_size {
        r.warn(
            block.pos,
            "cache.item_max_size",
            format!(
                "item_max_size ({} MB) is larger than mem_size_mb ({} MB): such items never fit",
                cfg.item_max_size / MB,
                cfg.mem_size / MB
            ),
        );
    }
    ok.then_some(cfg)
}

fn read_storage(node: &Node, path: &str, r: &mut Reader) -> Option<Storage> {
    let text = r.non_empty_string(node, path)?;
    let lower = text.trim().to_ascii_lowercase();
    let not_built = |r: &mut Reader, what: &str| {
        r.warn(
            node.pos,
            path,
            format!("{what} is not built in aralez yet: responses are cached in memory only"),
        )
    };
    match lower.as_str() {
        "memory" => Some(Storage::Memory),
        "hybrid" => Some(Storage::Hybrid),
        _ if lower.starts_with("redis://") => {
            let url = text.trim();
            let checked =
                super::values::check_redis_url(url).map_err(|why| r.error(node.pos, path, why));
            checked.ok().map(|()| Storage::Redis(url.to_string()))
        }
        _ if lower.contains("://") => {
            not_built(r, &format!("storage `{}`", text.trim()));
            Some(Storage::Memory)
        }
        _ => {
            r.error(
                node.pos,
                path,
                format!("`{text}` is not memory, hybrid or redis://host:port[/db] (rediss:// is not supported)"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::issues::Issues;
    use crate::config::yaml;

    fn read(text: &str) -> (Option<CacheConfig>, Issues) {
        let mut issues = Issues::default();
        let doc = yaml::parse(text).expect("yaml");
        let mut r = Reader::new("main.yaml".into(), &mut issues);
        let cfg = read_cache(&doc, &mut r);
        (cfg, issues)
    }

    #[test]
    fn aralez_block_reads_with_defaults() {
        let (cfg, issues) = read("storage: memory\nmem_size_mb: 16\nttl: 60\n");
        let cfg = cfg.expect("read");
        assert!(!issues.has_errors());
        assert_eq!(cfg.mem_size, 16 * MB);
        assert_eq!(cfg.ttl, Duration::from_secs(60));
        assert_eq!(cfg.item_max_size, 5 * MB);
    }

    #[test]
    fn bad_values_are_errors_and_unbuilt_tiers_warnings() {
        let (cfg, issues) = read("storage: floppy\n");
        assert!(cfg.is_none() && issues.has_errors());
        let (cfg, issues) = read("storage: \"redis://127.0.0.1:6379/0\"\n");
        assert!(matches!(cfg.map(|c| c.storage), Some(Storage::Redis(_))));
        assert!(!issues.has_errors() && issues.warnings().next().is_none());
        let (cfg, issues) = read("storage: \"tikv://127.0.0.1:2379\"\n");
        assert_eq!(cfg.map(|c| c.storage), Some(Storage::Memory));
        assert!(issues.warnings().any(|w| w.message.contains("memory only")));
        let (cfg, issues) = read("mem_size_mb: 0\n");
        assert!(cfg.is_none() && issues.has_errors());
    }
}
