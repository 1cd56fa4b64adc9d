//! The access log writer: failed writes, counted and mended.

use super::*;

#[test]
fn lines_that_went_out_whole_before_a_failure_are_not_counted_lost() {
    let batch = "a\nbb\nccc\n";
    assert_eq!(lines_lost(batch, 0, 3, false), 3);
    assert_eq!(lines_lost(batch, 2, 3, false), 2);
    assert_eq!(lines_lost(batch, 4, 3, false), 2, "one line cut");
    assert_eq!(lines_lost(batch, 5, 3, false), 1);
    let torn = "\na\nbb\n";
    assert_eq!(lines_lost(torn, 1, 2, true), 2, "only the torn line's end");
    assert_eq!(lines_lost(torn, 3, 2, true), 1);
}

/// Takes `room` bytes, then fails as a full disk does.
struct Full {
    room: usize,
    took: Vec<u8>,
}

impl std::io::Write for Full {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.room == 0 {
            return Err(std::io::Error::from_raw_os_error(28));
        }
        let n = buf.len().min(self.room).min(3);
        self.room -= n;
        self.took.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_write_that_fails_part_way_says_how_much_went_out() {
    let mut full = Full {
        room: 7,
        took: Vec::new(),
    };
    let part = write_counted(&mut full, b"a\nbb\nccc\n").unwrap_err();
    assert_eq!((part.bytes, full.took.as_slice()), (7, &b"a\nbb\ncc"[..]));
    assert_eq!(part.error.raw_os_error(), Some(28));
    let mut roomy = Full {
        room: 100,
        took: Vec::new(),
    };
    assert!(write_counted(&mut roomy, b"a\nbb\n").is_ok());
    assert_eq!(roomy.took, b"a\nbb\n");
}

/// An access log on a full disk (a link to /dev/full) until [`FullDisk::make_room`].
struct FullDisk {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    out: Destination,
    metrics: Metrics,
    failures: WriteFailures,
}

impl FullDisk {
    fn new() -> FullDisk {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let file = Arc::new(crate::logfile::LogFile::open(&path, None).unwrap());
        FullDisk {
            _dir: dir,
            path,
            out: Destination::File(file),
            metrics: Metrics::new(1),
            failures: WriteFailures::default(),
        }
    }

    fn write(&mut self, line: &str) {
        let (mut batch, mut lines) = (line.to_string(), 1);
        let (out, metrics) = (&self.out, &self.metrics);
        write_batch(out, &mut batch, &mut lines, metrics, &mut self.failures);
    }

    fn make_room(&self) {
        std::fs::remove_file(&self.path).unwrap();
        self.out.reopen();
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap()
    }
}

#[test]
fn the_line_after_a_failed_write_starts_on_a_line_of_its_own() {
    let mut log = FullDisk::new();
    log.write("lost line\n");
    log.make_room();
    log.write("next line\n");
    assert_eq!(log.text(), "\nnext line\n");
    log.write("then\n");
    assert_eq!(log.text(), "\nnext line\nthen\n");
}

/// A disk full for a burst, then not: the lines lost after the first report are told by a
/// write that goes through once a minute has passed, or when the log ends (they had waited
/// for another failure).
#[test]
fn lines_lost_after_the_report_are_told_when_writes_go_through_or_the_log_ends() {
    let mut log = FullDisk::new();
    for _ in 0..3 {
        log.write("lost line\n");
    }
    log.make_room();
    log.write("next line\n");
    assert_eq!(
        log.failures.lost_since, 2,
        "within the minute of the first report: still to tell"
    );
    // A minute on, as nothing said since (an Instant a minute back does not exist on a
    // machine up for less, and the check was skipped there).
    log.failures.said_at = None;
    log.write("then\n");
    assert_eq!(log.failures.lost_since, 0, "a minute on: told");
    let mut ending = WriteFailures {
        lost_since: 2,
        ..WriteFailures::default()
    };
    assert_eq!(ending.ended(), Some(2));
    assert_eq!(ending.ended(), None);
}
