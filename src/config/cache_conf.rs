//! main.yaml's `cache:` block (Aralez 0.95's keys, SPEC §14): where responses are kept and how
//! much. Only parsing and validation live here; the cache itself is `layers::cache`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::reader::{join, Reader};
use super::yaml::{Node, Pos, Value};

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
    /// Where `file_path` is written, for the check of its directory.
    pub file_path_at: Option<Pos>,
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
            file_path_at: None,
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

/// The keys of the disk tier, which only `storage: hybrid` has.
const DISK_KEYS: [&str; 3] = ["file_size_mb", "file_path", "flush_interval"];

/// Reads the `cache:` block. `None` when a value is wrong (each error already reported).
pub fn read_cache(block: &Node, r: &mut Reader) -> Option<CacheConfig> {
    let mut cfg = CacheConfig::default();
    if matches!(block.value, Value::Null) {
        let why = "says nothing (every key under it left out or commented out): the cache is on, with its defaults (64 MB in memory, ttl 300 s); remove the key for no cache";
        r.warn(block.pos, "cache", why);
    }
    let entries = r.map(block, "cache")?;
    let mut ok = true;
    let mut disk_keys = Vec::new();
    for (key, value) in entries {
        if DISK_KEYS.contains(&key.name.as_str()) {
            disk_keys.push((key.name.as_str(), key.pos));
        }
        let path = join("cache", &key.name);
        let p = path.as_str();
        let megabytes = |r: &mut Reader, max: u64| r.uint(value, p, 1, max).map(|n| n * MB);
        let read = match key.name.as_str() {
            "storage" => read_storage(value, p, r).map(|s| cfg.storage = s),
            "mem_size_mb" => megabytes(r, 1024 * 1024).map(|n| cfg.mem_size = n),
            "file_size_mb" => megabytes(r, 1024 * 1024 * 1024).map(|n| cfg.file_size = n),
            "file_path" => r.non_empty_string(value, p).map(|s| {
                cfg.file_path = PathBuf::from(s);
                cfg.file_path_at = Some(value.pos);
            }),
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
    if ok && cfg.storage != Storage::Hybrid {
        for (name, pos) in disk_keys {
            let why = "not used: only storage: hybrid has a disk tier";
            r.warn(pos, &join("cache", name), why);
        }
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

/// A `hybrid` cache's directory (`file_path`, relative to `base_dir`) must be one a start can
/// make, read and write: the start failed on it with no key named, and check-config passed.
/// Where it cannot be (a file in the way, /proc or /sys) it is an error; where this user may
/// not write it, an error as root (the user a service starts as) and a warning otherwise, as
/// for the log files. `block` is where the `cache:` block stands. False on an error.
pub fn check_file_path(cfg: &CacheConfig, base_dir: &Path, block: Pos, r: &mut Reader) -> bool {
    if cfg.storage != Storage::Hybrid {
        return true;
    }
    let dir = base_dir.join(&cfg.file_path);
    let pos = cfg.file_path_at.unwrap_or(block);
    let Some((why, certain)) = dir_problem(&dir) else {
        return true;
    };
    if certain || nix::unistd::geteuid().is_root() {
        r.error(pos, "cache.file_path", why);
        return false;
    }
    r.warn(pos, "cache.file_path", why);
    true
}

/// What stops the disk tier from using `dir`, and whether that holds for every user.
fn dir_problem(dir: &Path) -> Option<(String, bool)> {
    use nix::unistd::{access, AccessFlags};
    let shown = dir.display();
    let mut existing = dir;
    while std::fs::symlink_metadata(existing).is_err() {
        existing = match existing.parent() {
            Some(up) if !up.as_os_str().is_empty() => up,
            _ => Path::new("."),
        };
    }
    let canonical = std::fs::canonicalize(existing).ok()?;
    if canonical.starts_with("/proc") || canonical.starts_with("/sys") {
        let why = format!("`{shown}` is on a kernel file system (/proc, /sys): the disk tier cannot keep files there");
        return Some((why, true));
    }
    if !std::fs::metadata(existing).ok()?.is_dir() {
        let why = match existing == dir {
            true => format!("`{shown}` is not a directory"),
            false => format!(
                "`{shown}` cannot be made: `{}` is not a directory",
                existing.display()
            ),
        };
        return Some((why, true));
    }
    let needs = AccessFlags::W_OK | AccessFlags::X_OK | AccessFlags::R_OK;
    let Err(e) = access(existing, needs) else {
        return None;
    };
    let uid = nix::unistd::geteuid();
    let why = match existing == dir {
        true => format!("`{shown}` cannot be read and written by this user (uid {uid}: {e}): the disk tier keeps its files there"),
        false => format!(
            "`{shown}` cannot be made by this user in `{}` (uid {uid}: {e})",
            existing.display()
        ),
    };
    Some((why, false))
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

    fn file_path_issues(path: &str) -> (bool, Vec<String>) {
        let mut issues = Issues::default();
        let text = format!("storage: hybrid\nfile_path: \"{path}\"\n");
        let doc = yaml::parse(&text).expect("yaml");
        let mut r = Reader::new("main.yaml".into(), &mut issues);
        let cfg = read_cache(&doc, &mut r).expect("read");
        let ok = check_file_path(&cfg, Path::new("/"), Pos::default(), &mut r);
        let said = issues.errors().chain(issues.warnings());
        (
            ok,
            said.map(|i| format!("{} {}", i.key, i.message)).collect(),
        )
    }

    /// A directory the disk tier cannot use is said at `cache.file_path` before any start.
    #[test]
    fn a_hybrid_directory_that_cannot_be_used_is_an_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("plain");
        std::fs::write(&file, "x").expect("file");
        for (path, says) in [
            (file.display().to_string(), "is not a directory"),
            (file.join("cache").display().to_string(), "cannot be made"),
            ("/proc/nope/cache".to_string(), "kernel file system"),
        ] {
            let (ok, said) = file_path_issues(&path);
            assert!(!ok, "{path}: {said:?}");
            assert!(
                said.iter()
                    .any(|s| s.starts_with("cache.file_path") && s.contains(says)),
                "{path}: {said:?}"
            );
        }
        let fine = tmp.path().join("a/b/cache").display().to_string();
        assert_eq!(file_path_issues(&fine), (true, vec![]));
    }
}
