//! The disk tier of `storage: hybrid`: every stored answer is also written under `file_path`
//! (one file per key and `Vary` variant, written to a temporary name and renamed, so a reader
//! never sees half a file), bounded by `file_size_mb` (oldest files go first), and read back
//! when the memory tier misses, including after a restart. A file whose checksum fails, or that
//! is short, is a miss and is removed. Files are written by one thread of their own, so the
//! request path never waits for the disk; SIGTERM waits for what is queued. A written file
//! reaches the disk itself (`syncfs`) at most `flush_interval` after it was written, and on
//! SIGTERM: one sync for all that was written meanwhile, so a crash loses at most that much
//! (and what it leaves half-written fails its checksum).
//!
//! File layout: `ARZC` 1, then length-prefixed fields (key, status, wall-clock time stored,
//! ages and allowances in ms, flags, headers, `Vary` values, body), then a CRC-32 of all of it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use tokio::time::Instant;

use super::entry::Entry;

const MAGIC: &[u8; 5] = b"ARZC\x01";
/// Writes waiting for the disk at most; past it an answer is kept in memory only.
const QUEUE: usize = 1024;

enum Job {
    Write {
        name: String,
        key: Box<str>,
        entry: Arc<Entry>,
    },
    Remove(Vec<String>),
    Flush(std::sync::mpsc::Sender<()>),
}

struct FileRef {
    name: String,
    size: u64,
    seq: u64,
}

#[derive(Default)]
struct Index {
    by_key: HashMap<Box<str>, Vec<FileRef>>,
    /// Oldest first: (sequence, key) of every file.
    order: BTreeMap<u64, Box<str>>,
    total: u64,
    seq: u64,
}

/// The disk tier: its directory, its index and its writer thread.
pub struct DiskTier {
    dir: PathBuf,
    max_bytes: u64,
    index: Mutex<Index>,
    writer: SyncSender<Job>,
    /// Keys read back into memory.
    pub reads: AtomicU64,
    /// Files removed to stay within `file_size_mb`.
    pub evictions: AtomicU64,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier").field("dir", &self.dir).finish()
    }
}

impl DiskTier {
    /// Opens `dir` (made if missing), indexes the files a previous run left and removes the
    /// broken ones, and starts the writer thread.
    pub fn open(
        dir: &Path,
        max_bytes: u64,
        flush_interval: Duration,
    ) -> std::io::Result<Arc<DiskTier>> {
        std::fs::create_dir_all(dir)?;
        let (writer, jobs) = sync_channel(QUEUE);
        let tier = Arc::new(DiskTier {
            dir: dir.to_path_buf(),
            max_bytes,
            index: Mutex::new(Index::default()),
            writer,
            reads: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        });
        tier.scan()?;
        let dir = dir.to_path_buf();
        std::thread::Builder::new()
            .name("aralez-cache-disk".into())
            .spawn(move || write_loop(&dir, &jobs, flush_interval, sync_disk))?;
        Ok(tier)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Indexes the directory's valid files by age; removes temporary and broken ones.
    fn scan(&self) -> std::io::Result<()> {
        let mut found = Vec::new();
        for item in std::fs::read_dir(&self.dir)? {
            let path = item?.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            match std::fs::read(&path)
                .ok()
                .and_then(|b| decode(&b).map(|e| (e, b.len())))
            {
                Some(((key, _, stored), size)) if !name.contains(".tmp") => {
                    found.push((stored, key, name, size as u64))
                }
                _ => {
                    tracing::warn!(file = %path.display(), "cache: removing a broken or unfinished file");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        found.sort_by_key(|(stored, ..)| *stored);
        let mut index = self.index();
        for (_, key, name, size) in found {
            add(&mut index, key.into(), name, size);
        }
        let evicted = evict(&mut index, self.max_bytes);
        drop(index);
        self.send(Job::Remove(evicted));
        Ok(())
    }

    /// Queues `entry` under `key` for the disk; evicts the oldest files past `file_size_mb`.
    pub fn write(&self, key: &str, entry: &Arc<Entry>) {
        let name = file_name(key, entry);
        let mut index = self.index();
        remove_named(&mut index, key, &name);
        add(
            &mut index,
            key.into(),
            name.clone(),
            encoded_len(key, entry),
        );
        let evicted = evict(&mut index, self.max_bytes);
        let kept = index
            .by_key
            .get(key)
            .is_some_and(|files| files.iter().any(|f| f.name == name));
        drop(index);
        if !evicted.is_empty() {
            self.evictions
                .fetch_add(evicted.len() as u64, Ordering::Relaxed);
            self.send(Job::Remove(evicted));
        }
        // Larger than the whole tier: it was evicted at once and is not written.
        let job = Job::Write {
            name: name.clone(),
            key: key.into(),
            entry: entry.clone(),
        };
        if kept && !self.send(job) {
            // Not queued: forget it again.
            remove_named(&mut self.index(), key, &name);
        }
    }

    /// Drops every file of `key`; returns how many there were.
    pub fn remove_key(&self, key: &str) -> usize {
        let mut index = self.index();
        let Some(files) = index.by_key.remove(key) else {
            return 0;
        };
        let names: Vec<String> = files
            .into_iter()
            .map(|f| {
                index.order.remove(&f.seq);
                index.total -= f.size;
                f.name
            })
            .collect();
        drop(index);
        let n = names.len();
        self.send(Job::Remove(names));
        n
    }

    /// What the files hold now, in bytes.
    pub fn bytes(&self) -> u64 {
        self.index().total
    }

    /// Some file is indexed for `key` (no disk access).
    pub fn has(&self, key: &str) -> bool {
        self.index().by_key.contains_key(key)
    }

    /// The keys on disk, for a purge by prefix.
    pub fn keys(&self) -> Vec<Box<str>> {
        self.index().by_key.keys().cloned().collect()
    }

    /// Reads the variants stored for `key` (blocking: call it off the runtime's threads). Broken
    /// files are removed and skipped.
    pub fn read_key(&self, key: &str) -> Vec<Entry> {
        let names: Vec<String> = match self.index().by_key.get(key) {
            Some(files) => files.iter().map(|f| f.name.clone()).collect(),
            None => return Vec::new(),
        };
        let mut entries = Vec::new();
        for name in names {
            let path = self.dir.join(&name);
            match std::fs::read(&path).ok().and_then(|b| decode(&b)) {
                Some((file_key, entry, _)) if file_key == key => entries.push(entry),
                Some(_) => {}
                None => {
                    tracing::warn!(file = %path.display(), "cache: a broken file is a miss; removed");
                    remove_named(&mut self.index(), key, &name);
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        entries
    }

    /// Waits until every queued write is on disk, at most `limit` (SIGTERM).
    pub fn flush(&self, limit: Duration) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.writer.send(Job::Flush(done)).is_ok() {
            let _ = wait.recv_timeout(limit);
        }
    }

    fn send(&self, job: Job) -> bool {
        match self.writer.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                tracing::debug!("cache: disk queue full; the answer stays in memory only");
                false
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

fn add(index: &mut Index, key: Box<str>, name: String, size: u64) {
    index.seq += 1;
    let seq = index.seq;
    index.order.insert(seq, key.clone());
    index.total += size;
    index
        .by_key
        .entry(key)
        .or_default()
        .push(FileRef { name, size, seq });
}

/// Forgets the file `name` of `key`; true if it was indexed.
fn remove_named(index: &mut Index, key: &str, name: &str) -> bool {
    let Some(files) = index.by_key.get_mut(key) else {
        return false;
    };
    let Some(at) = files.iter().position(|f| f.name == name) else {
        return false;
    };
    let file = files.remove(at);
    if files.is_empty() {
        index.by_key.remove(key);
    }
    index.order.remove(&file.seq);
    index.total -= file.size;
    true
}

/// Drops the oldest files until the tier is within `max`; returns their names.
fn evict(index: &mut Index, max: u64) -> Vec<String> {
    let mut gone = Vec::new();
    while index.total > max {
        let Some((seq, key)) = index.order.pop_first() else {
            break;
        };
        let Some(files) = index.by_key.get_mut(&key) else {
            continue;
        };
        if let Some(at) = files.iter().position(|f| f.seq == seq) {
            let file = files.remove(at);
            index.total -= file.size;
            gone.push(file.name);
        }
        if files.is_empty() {
            index.by_key.remove(&key);
        }
    }
    gone
}

/// The disk tier's failed writes since the last that succeeded: a full disk is said once, and
/// its end with the count, not a line per write.
#[derive(Default)]
struct WriteFailures(u64);

impl WriteFailures {
    /// A write failed: whether to say so (the first of a run).
    fn failed(&mut self) -> bool {
        self.0 += 1;
        self.0 == 1
    }

    /// A write succeeded: how many failed before it, if any did.
    fn succeeded(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.0)).filter(|n| *n > 0)
    }
}

/// The writer thread: runs `jobs` in order, and `sync`s `dir` at most `interval` after the
/// first write since the last sync, on a flush, and when the tier goes.
fn write_loop(dir: &Path, jobs: &Receiver<Job>, interval: Duration, sync: fn(&Path)) {
    let mut sync_due: Option<std::time::Instant> = None;
    let mut failures = WriteFailures::default();
    loop {
        let job = match sync_due {
            Some(due) => {
                jobs.recv_timeout(due.saturating_duration_since(std::time::Instant::now()))
            }
            None => jobs.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match job {
            Ok(Job::Write { name, key, entry }) => {
                let tmp = dir.join(format!("{name}.tmp"));
                let written = std::fs::write(&tmp, encode(&key, &entry))
                    .and_then(|()| std::fs::rename(&tmp, dir.join(&name)));
                match written {
                    Err(e) => {
                        if failures.failed() {
                            tracing::warn!(file = %tmp.display(), "cache: cannot write: {e} (the disk tier serves what it has; failures are counted until a write succeeds)");
                        }
                        let _ = std::fs::remove_file(&tmp);
                    }
                    Ok(()) => {
                        if let Some(failed) = failures.succeeded() {
                            tracing::warn!(dir = %dir.display(), "cache: writing again, after {failed} failed writes");
                        }
                    }
                }
                sync_due.get_or_insert_with(|| std::time::Instant::now() + interval);
            }
            Ok(Job::Remove(names)) => {
                for name in names {
                    let _ = std::fs::remove_file(dir.join(name));
                }
            }
            Ok(Job::Flush(done)) => {
                if sync_due.take().is_some() {
                    sync(dir);
                }
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                if sync_due.is_some() {
                    sync(dir);
                }
                return;
            }
        }
        if sync_due.is_some_and(|due| std::time::Instant::now() >= due) {
            sync_due = None;
            sync(dir);
        }
    }
}

/// Makes what was written under `dir` durable: one `syncfs` for the whole file system.
fn sync_disk(dir: &Path) {
    let synced = std::fs::File::open(dir)
        .and_then(|d| nix::unistd::syncfs(&d).map_err(std::io::Error::from));
    if let Err(e) = synced {
        tracing::warn!(dir = %dir.display(), "cache: cannot sync the disk tier: {e}");
    }
}

/// One file per key and variant: a SHA-256 of both, in hex.
pub(super) fn file_name(key: &str, entry: &Entry) -> String {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(key.as_bytes());
    for (name, value) in &entry.vary {
        ctx.update(b"\n");
        ctx.update(name.as_str().as_bytes());
        ctx.update(b":");
        ctx.update(value.as_ref().map_or(&b"\0"[..], |v| v.as_bytes()));
    }
    let digest = ctx.finish();
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u32).to_le_bytes());
    out.extend_from_slice(field);
}

fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What [`encode`] will write, counted without writing it.
fn encoded_len(key: &str, e: &Entry) -> u64 {
    let fields = |n: &str, v: &[u8]| 8 + n.len() + v.len();
    let headers: usize = e
        .headers
        .iter()
        .map(|(n, v)| fields(n.as_str(), v.as_bytes()))
        .sum();
    let vary: usize = e
        .vary
        .iter()
        .map(|(n, v)| 1 + fields(n.as_str(), v.as_ref().map_or(&[][..], |v| v.as_bytes())))
        .sum();
    (MAGIC.len() + 4 + key.len() + 2 + 5 * 8 + 1 + 8 + headers + vary + 4 + e.body.len() + 4) as u64
}

pub(super) fn encode(key: &str, e: &Entry) -> Vec<u8> {
    let mut out = Vec::with_capacity(e.body.len() + 512);
    out.extend_from_slice(MAGIC);
    put(&mut out, key.as_bytes());
    out.extend_from_slice(&e.status.as_u16().to_le_bytes());
    let stored = SystemTime::now() - Instant::now().saturating_duration_since(e.stored_at);
    put_u64(
        &mut out,
        ms(stored.duration_since(UNIX_EPOCH).unwrap_or_default()),
    );
    for d in [
        e.initial_age,
        e.fresh_for,
        e.stale_while_revalidate,
        e.stale_if_error,
    ] {
        put_u64(&mut out, ms(d));
    }
    out.push(u8::from(e.must_revalidate) | (u8::from(e.shared_with_auth) << 1));
    out.extend_from_slice(&(e.headers.len() as u32).to_le_bytes());
    for (name, value) in &e.headers {
        put(&mut out, name.as_str().as_bytes());
        put(&mut out, value.as_bytes());
    }
    out.extend_from_slice(&(e.vary.len() as u32).to_le_bytes());
    for (name, value) in &e.vary {
        put(&mut out, name.as_str().as_bytes());
        out.push(u8::from(value.is_some()));
        put(&mut out, value.as_ref().map_or(&[][..], |v| v.as_bytes()));
    }
    put(&mut out, &e.body);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads fields off the front of a file's bytes; `None` at the first short field.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn header(&mut self) -> Option<(HeaderName, &'a [u8])> {
        Some((HeaderName::from_bytes(self.bytes()?).ok()?, self.bytes()?))
    }
}

/// A file's key, entry and wall-clock time stored; `None` when it is short, altered or not ours.
pub(super) fn decode(file: &[u8]) -> Option<(String, Entry, u64)> {
    let (data, crc) = file.split_at(file.len().checked_sub(4)?);
    if crc32fast::hash(data).to_le_bytes() != crc {
        return None;
    }
    let mut f = Fields(data);
    if f.take(MAGIC.len())? != MAGIC {
        return None;
    }
    let key = String::from_utf8(f.bytes()?.to_vec()).ok()?;
    let status = StatusCode::from_u16(u16::from_le_bytes(f.take(2)?.try_into().ok()?)).ok()?;
    let stored_ms = f.u64()?;
    let mut durations = [Duration::ZERO; 4];
    for d in &mut durations {
        *d = Duration::from_millis(f.u64()?);
    }
    let flags = f.take(1)?[0];
    let mut headers = HeaderMap::new();
    for _ in 0..f.u32()? {
        let (name, value) = f.header()?;
        headers.append(name, HeaderValue::from_bytes(value).ok()?);
    }
    let mut vary = Vec::new();
    for _ in 0..f.u32()? {
        let name = HeaderName::from_bytes(f.bytes()?).ok()?;
        let present = f.take(1)?[0] == 1;
        let value = f.bytes()?;
        vary.push((
            name,
            if present {
                Some(HeaderValue::from_bytes(value).ok()?)
            } else {
                None
            },
        ));
    }
    let body = Bytes::copy_from_slice(f.bytes()?);
    let stored_wall = UNIX_EPOCH + Duration::from_millis(stored_ms);
    let ago = SystemTime::now()
        .duration_since(stored_wall)
        .unwrap_or_default();
    let now = Instant::now();
    let [initial_age, fresh_for, stale_while_revalidate, stale_if_error] = durations;
    // Stored before this clock's origin (the machine restarted): count the time in the ages.
    let (stored_at, initial_age, fresh_for) = match now.checked_sub(ago) {
        Some(at) => (at, initial_age, fresh_for),
        None => (now, initial_age + ago, fresh_for.saturating_sub(ago)),
    };
    let entry = Entry {
        status,
        headers,
        body,
        vary,
        shared_with_auth: flags & 2 != 0,
        stored_at,
        initial_age,
        fresh_for,
        must_revalidate: flags & 1 != 0,
        stale_while_revalidate,
        stale_if_error,
    };
    Some((key, entry, stored_ms))
}

#[cfg(test)]
mod tests;
