use super::*;

fn entry() -> Entry {
    let mut headers = HeaderMap::new();
    headers.insert("etag", HeaderValue::from_static("\"x\""));
    Entry {
        status: StatusCode::OK,
        headers,
        body: Bytes::from_static(b"hello"),
        vary: vec![(
            http::header::ACCEPT_LANGUAGE,
            Some(HeaderValue::from_static("fr")),
        )],
        shared_with_auth: true,
        stored_at: Instant::now(),
        initial_age: Duration::from_secs(3),
        fresh_for: Duration::from_secs(60),
        must_revalidate: false,
        stale_while_revalidate: Duration::from_secs(5),
        stale_if_error: Duration::ZERO,
    }
}

#[test]
fn an_entry_reads_back_whole_and_any_damage_is_refused() {
    let bytes = encode("http://a/b", &entry());
    assert_eq!(bytes.len() as u64, encoded_len("http://a/b", &entry()));
    let (key, back, _) = decode(&bytes).expect("decodes");
    assert_eq!(key, "http://a/b");
    assert_eq!(
        (back.body.as_ref(), back.status),
        (&b"hello"[..], StatusCode::OK)
    );
    assert_eq!(back.headers["etag"], "\"x\"");
    assert_eq!(back.vary, entry().vary);
    assert!(back.shared_with_auth && !back.must_revalidate);
    assert_eq!(back.stale_while_revalidate, Duration::from_secs(5));
    for cut in [0, 4, 10, bytes.len() / 2, bytes.len() - 1] {
        assert!(decode(&bytes[..cut]).is_none(), "{cut}");
    }
    let mut flipped = bytes.clone();
    flipped[20] ^= 1;
    assert!(decode(&flipped).is_none());
}

#[test]
fn written_files_reach_the_disk_within_the_interval_and_on_a_flush() {
    use std::sync::atomic::AtomicUsize;
    static SYNCS: AtomicUsize = AtomicUsize::new(0);
    fn count(_: &Path) {
        SYNCS.fetch_add(1, Ordering::SeqCst);
    }
    let syncs = || SYNCS.load(Ordering::SeqCst);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let run = |interval: Duration| {
        let (jobs, queue) = sync_channel(8);
        let path = dir.path().to_path_buf();
        let thread = std::thread::spawn(move || write_loop(&path, &queue, interval, count));
        (jobs, thread)
    };
    let write = |jobs: &SyncSender<Job>, name: &str| {
        let (name, key, entry) = (name.to_string(), "http://a/b".into(), Arc::new(entry()));
        jobs.send(Job::Write { name, key, entry }).expect("queued");
    };
    let flush = |jobs: &SyncSender<Job>| {
        let (done, wait) = std::sync::mpsc::channel();
        jobs.send(Job::Flush(done)).expect("queued");
        wait.recv().expect("flushed");
    };
    // An hour's interval: nothing written, nothing synced; a flush syncs what was written.
    let (jobs, thread) = run(Duration::from_secs(3600));
    flush(&jobs);
    assert_eq!(syncs(), 0);
    write(&jobs, "one");
    write(&jobs, "two");
    flush(&jobs);
    assert_eq!(syncs(), 1, "one sync for both");
    assert!(dir.path().join("two").is_file());
    drop(jobs);
    thread.join().expect("writer thread");
    assert_eq!(syncs(), 1, "nothing left to sync at the end");
    // No interval: each write is synced as it is written; the flush finds nothing left.
    let (jobs, thread) = run(Duration::ZERO);
    write(&jobs, "three");
    flush(&jobs);
    assert_eq!(syncs(), 2);
    drop(jobs);
    thread.join().expect("writer thread");
}

/// A full disk is said once a run of failures, and its end with their count.
#[test]
fn failed_writes_are_said_once_a_run() {
    let mut failures = WriteFailures::default();
    assert_eq!(failures.succeeded(), None);
    let said: Vec<bool> = (0..196).map(|_| failures.failed()).collect();
    assert_eq!(said.iter().filter(|s| **s).count(), 1);
    assert!(said[0]);
    assert_eq!(failures.succeeded(), Some(196));
    assert_eq!(failures.succeeded(), None);
    assert!(failures.failed(), "a new run is said again");
}
