//! Reading a file the configuration names: a regular file only, and at most a bound of it. A
//! FIFO or a device at such a path (a mistake, or a symlink someone planted) would otherwise
//! hang a reload for good (opening a FIFO waits for a writer, and the reload waits with it) or
//! be read without end (`/dev/zero`). The file is opened without blocking and judged by the
//! open descriptor, so a FIFO swapped in after a look at the name is caught too.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    #[error("{}", io_reason(.0))]
    Io(#[from] std::io::Error),
    #[error("is a directory, not a file")]
    Directory,
    #[error("is not a regular file (a FIFO, a device or a socket)")]
    NotRegular,
    #[error("file is {len} bytes or more, over the {} MiB limit", .limit / (1024 * 1024))]
    TooLarge { len: u64, limit: u64 },
}

/// The bytes of the regular file at `path`, if it holds at most `limit`.
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, FileProblem> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(FileProblem::Directory);
    }
    if !meta.is_file() {
        return Err(FileProblem::NotRegular);
    }
    if meta.len() > limit {
        return Err(FileProblem::TooLarge {
            len: meta.len(),
            limit,
        });
    }
    // The length may have grown since: at most one byte past the limit is read to tell.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    let len = bytes.len() as u64;
    if len > limit {
        return Err(FileProblem::TooLarge { len, limit });
    }
    Ok(bytes)
}

/// An I/O error without the "(os error N)" suffix.
pub fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = tempfile::tempdir().expect("a directory");
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, b"0123456789").expect("written");
        assert_eq!(read_regular(&file, 10).expect("read"), b"0123456789");
        let too_large = read_regular(&file, 9).expect_err("over the limit");
        assert!(
            matches!(too_large, FileProblem::TooLarge { len: 10, .. }),
            "{too_large}"
        );
        let folder = read_regular(dir.path(), 10).expect_err("a directory");
        assert!(matches!(folder, FileProblem::Directory), "{folder}");
        let missing = read_regular(&dir.path().join("none"), 10).expect_err("missing");
        assert_eq!(missing.to_string(), "no such file");
    }

    /// A FIFO with no writer: opening it for reading would block for good.
    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().expect("a directory");
        let fifo = dir.path().join("upstreams.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("a FIFO");
        let refused = read_regular(&fifo, 10).expect_err("a FIFO");
        assert!(matches!(refused, FileProblem::NotRegular), "{refused}");
    }

    /// A device that never ends.
    #[test]
    fn a_device_is_refused() {
        let refused = read_regular(Path::new("/dev/zero"), 10).expect_err("a device");
        assert!(matches!(refused, FileProblem::NotRegular), "{refused}");
    }
}
