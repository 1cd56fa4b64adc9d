//! Log files: what the app log and the access log write to when they go to a file. A
//! [`LogFile`] appends whole writes at its path, is reopened at that path on SIGUSR1 (for
//! logrotate), and, when `log_file`/`access_log_file` give Aralez 0.95's
//! `"path, max MB, keep, compress"` form, rotates itself: past `max MB` the file becomes `path.1`
//! (older ones shift to `path.2` ... `path.keep`, the oldest is removed) and a fresh one is opened;
//! with `compress` a rotated file is gzipped to `path.1.gz` on a background thread.
//!
//! Writers hold a mutex only for their write (and, once per `max MB`, for the renames). A
//! compression still running when the next rotation comes is waited for first, so the names never
//! race. It never panics on I/O: errors go back to the writer, which counts or reports them.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::config::log_conf::Rotation;

/// A write that failed after `bytes` of its buffer had gone out.
#[derive(Debug)]
pub struct PartWritten {
    pub bytes: usize,
    pub error: io::Error,
}

impl From<PartWritten> for io::Error {
    fn from(part: PartWritten) -> io::Error {
        part.error
    }
}

/// `write_all`, saying how much went out when it fails (a full disk takes part of a batch).
pub fn write_counted(out: &mut impl Write, buf: &[u8]) -> Result<(), PartWritten> {
    let mut bytes = 0;
    while bytes < buf.len() {
        match out.write(&buf[bytes..]) {
            Ok(0) => {
                let error = io::Error::from(io::ErrorKind::WriteZero);
                return Err(PartWritten { bytes, error });
            }
            Ok(n) => bytes += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(PartWritten { bytes, error }),
        }
    }
    Ok(())
}

/// An append-only log file, reopened on demand and rotated by size.
pub struct LogFile {
    path: PathBuf,
    rotation: Option<Rotation>,
    state: Mutex<State>,
    /// The file is also the process's stdout and stderr (a daemon's, `daemon`): each file it
    /// opens again takes their place, as nginx points stderr at its error log when it reopens
    /// it. Otherwise panics and stderr's messages went to a rotated file, deleted or not.
    carries_stdio: AtomicBool,
}

struct State {
    file: File,
    /// Bytes in the current file (its size at open, plus what was written since).
    size: u64,
    /// The gzip of the last rotated file, while it runs.
    compressing: Option<JoinHandle<()>>,
}

fn open_append(path: &Path) -> io::Result<(File, u64)> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let size = file.metadata().map_or(0, |m| m.len());
    Ok((file, size))
}

impl LogFile {
    /// Opens (creating) `path` for appending.
    pub fn open(path: &Path, rotation: Option<Rotation>) -> io::Result<LogFile> {
        let (file, size) = open_append(path)?;
        Ok(LogFile {
            path: path.to_path_buf(),
            rotation,
            state: Mutex::new(State {
                file,
                size,
                compressing: None,
            }),
            carries_stdio: AtomicBool::new(false),
        })
    }

    /// Makes each file this one opens from now on the process's stdout and stderr too (a
    /// daemon's, whose stdio the file already is).
    pub fn carry_stdio(&self) {
        self.carries_stdio.store(true, Ordering::Relaxed);
    }

    /// Points stdout and stderr at `file` if this log carries them.
    fn take_stdio(&self, file: &File) {
        if !self.carries_stdio.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = nix::unistd::dup2_stdout(file).and_then(|()| nix::unistd::dup2_stderr(file))
        {
            say_on_stderr(format_args!(
                "aralez: cannot point stderr at {}: {e}",
                self.path.display()
            ));
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the path again (creating it) and writes there from now on; on failure the old file
    /// stays in use.
    pub fn reopen(&self) -> io::Result<()> {
        let (file, size) = open_append(&self.path)?;
        self.take_stdio(&file);
        let mut state = self.lock();
        state.file = file;
        state.size = size;
        Ok(())
    }

    /// Writes `buf` whole at the end of the file, then rotates when the file has grown past
    /// its limit. A failed rotation is reported once to stderr and writing goes on in the same
    /// file.
    pub fn append(&self, buf: &[u8]) -> Result<(), PartWritten> {
        let mut state = self.lock();
        let written = write_counted(&mut state.file, buf);
        state.size += match &written {
            Ok(()) => buf.len() as u64,
            Err(part) => part.bytes as u64,
        };
        written?;
        if let Some(rotation) = self.rotation {
            if state.size >= rotation.max_bytes {
                if let Err(e) = self.rotate(&mut state, rotation) {
                    // The log itself is what failed; stderr is the one place left to say so.
                    say_on_stderr(format_args!(
                        "aralez: cannot rotate {}: {e}",
                        self.path.display()
                    ));
                    // Try again only after another full size, not on every write.
                    state.size = 0;
                }
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while writing leaves a usable file behind.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn rotate(&self, state: &mut State, rotation: Rotation) -> io::Result<()> {
        if let Some(running) = state.compressing.take() {
            let _ = running.join();
        }
        self.shift(rotation.keep)?;
        let moved = if rotation.keep == 0 {
            std::fs::remove_file(&self.path)
        } else {
            std::fs::rename(&self.path, numbered(&self.path, 1, false))
        };
        let gone = match moved {
            // Deleted (or its folder moved) under the process: a fresh file at the path, as a
            // reopen would make, instead of "cannot rotate" at every size and lines lost.
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            other => other.map(|()| false)?,
        };
        let (file, size) = open_append(&self.path)?;
        self.take_stdio(&file);
        state.file = file;
        state.size = size;
        if rotation.compress && rotation.keep > 0 && !gone {
            let rotated = numbered(&self.path, 1, false);
            state.compressing = std::thread::Builder::new()
                .name("aralez-log-gzip".into())
                .spawn(move || {
                    if let Err(e) = gzip_in_place(&rotated) {
                        say_on_stderr(format_args!(
                            "aralez: cannot compress {}: {e}",
                            rotated.display()
                        ));
                    }
                })
                .ok();
        }
        Ok(())
    }

    /// Makes room for a new `path.1`: removes `path.keep` and moves `path.i` to `path.i+1`.
    fn shift(&self, keep: u32) -> io::Result<()> {
        for gz in [false, true] {
            remove_if_there(&numbered(&self.path, keep.max(1), gz))?;
        }
        for i in (1..keep).rev() {
            for gz in [false, true] {
                let from = numbered(&self.path, i, gz);
                if from.exists() {
                    std::fs::rename(&from, numbered(&self.path, i + 1, gz))?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        if let Some(running) = self.lock().compressing.take() {
            let _ = running.join();
        }
    }
}

/// `path.N` or `path.N.gz`.
pub fn numbered(path: &Path, n: u32, gz: bool) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{n}"));
    if gz {
        name.push(".gz");
    }
    PathBuf::from(name)
}

fn remove_if_there(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Writes `path.gz` (through a temporary name, so a half-written archive is never taken for a
/// whole one) and removes `path`.
fn gzip_in_place(path: &Path) -> io::Result<()> {
    let mut gz_name = path.as_os_str().to_os_string();
    gz_name.push(".gz");
    let gz = PathBuf::from(gz_name);
    let mut tmp_name = gz.as_os_str().to_os_string();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut input = File::open(path)?;
    let mut encoder =
        flate2::write::GzEncoder::new(File::create(&tmp)?, flate2::Compression::default());
    io::copy(&mut input, &mut encoder)?;
    encoder.finish()?.sync_all()?;
    std::fs::rename(&tmp, &gz)?;
    std::fs::remove_file(path)
}

/// Writes one line to stderr, whatever becomes of it: `eprintln!` panics when stderr cannot be
/// written (a closed pipe, a full disk under a daemon's log), and a panic aborts the process.
pub fn say_on_stderr(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn rotation(max_bytes: u64, keep: u32, compress: bool) -> Option<Rotation> {
        Some(Rotation {
            max_bytes,
            keep,
            compress,
        })
    }

    #[test]
    fn a_file_deleted_under_it_is_made_again_at_the_next_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let log = LogFile::open(&path, rotation(100, 2, true)).unwrap();
        log.append(&[b'x'; 60]).unwrap();
        std::fs::remove_file(&path).unwrap();
        // Past the size: the rename finds nothing, and a fresh file takes the lines.
        log.append(&[b'y'; 60]).unwrap();
        log.append(b"after\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n");
    }

    #[test]
    fn rotates_past_the_size_and_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let log = LogFile::open(&path, rotation(100, 2, false)).unwrap();
        for i in 0..5 {
            log.append(format!("{i}{}\n", "x".repeat(99)).as_bytes())
                .unwrap();
        }
        log.append(b"last\n").unwrap();
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(path.clone()), "last\n");
        assert!(read(numbered(&path, 1, false)).starts_with('4'));
        assert!(read(numbered(&path, 2, false)).starts_with('3'));
        assert!(!numbered(&path, 3, false).exists());
    }

    #[test]
    fn compressed_rotations_are_whole_gzip_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.log");
        let log = LogFile::open(&path, rotation(1000, 3, true)).unwrap();
        for round in 0..4u8 {
            log.append(&vec![b'a' + round; 1000]).unwrap();
        }
        drop(log);
        let gunzip = |n: u32| {
            let mut text = Vec::new();
            let file = File::open(numbered(&path, n, true)).unwrap();
            flate2::read::GzDecoder::new(file)
                .read_to_end(&mut text)
                .unwrap();
            text
        };
        assert_eq!(gunzip(1), vec![b'd'; 1000]);
        assert_eq!(gunzip(3), vec![b'b'; 1000]);
        assert!(!numbered(&path, 1, false).exists());
        assert!(!numbered(&path, 4, true).exists());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
