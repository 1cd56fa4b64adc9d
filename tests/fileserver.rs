//! The built-in file server (SPEC §10) through the real binary: ranges, conditional requests,
//! index.html, no listings, no dotfiles, no escape from the folder.

use crate::support;

use std::net::SocketAddr;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONTENT: &str = "0123456789abcdefghijklmnopqrstuvwxyz";

/// The served files: a folder with a file, an index, dotfiles and a subfolder, in a directory
/// that also holds a file outside it. The folder must exist before the proxy starts.
fn files() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let www = root.path().join("www");
    std::fs::create_dir_all(www.join("sub")).unwrap();
    std::fs::create_dir_all(www.join(".git")).unwrap();
    std::fs::create_dir_all(www.join("empty")).unwrap();
    std::fs::write(www.join("a.txt"), CONTENT).unwrap();
    std::fs::write(www.join("index.html"), "<h1>home</h1>").unwrap();
    std::fs::write(www.join("sub/index.html"), "<h1>sub</h1>").unwrap();
    std::fs::write(www.join(".env"), "SECRET=1").unwrap();
    std::fs::write(www.join(".git/config"), "[core]").unwrap();
    std::fs::write(root.path().join("outside.txt"), "outside").unwrap();
    (root, www)
}

/// The file server's address, from the proxy's log.
fn file_server_addr(proxy: &ProxyProcess) -> SocketAddr {
    proxy
        .log_text()
        .lines()
        .filter(|l| l.contains("file server: serving"))
        .find_map(|l| address_after(l, " on http://"))
        .expect("file server address in the log")
}

/// A proxy whose file server serves `www`, with `extra` lines in main.yaml.
fn serving(www: &std::path::Path, extra: &str) -> ProxyProcess {
    let main = format!(
        "file_server_folder: \"{}\"\nfile_server_address: \"127.0.0.1:0\"\n{extra}",
        www.display()
    );
    ProxyProcess::start(&unused_route(), &main)
}

/// A proxy whose file server serves [`files`]; the folder's path, kept alive with the proxy.
fn start() -> (
    ProxyProcess,
    SocketAddr,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let (root, www) = files();
    let proxy = serving(&www, "");
    let addr = file_server_addr(&proxy);
    (proxy, addr, root, www)
}

/// Asks `method target` byte for byte (no client-side normalisation) on a connection of its
/// own; the whole answer.
async fn raw_asked(addr: SocketAddr, method: &str, target: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {target} HTTP/1.1\r\nHost: files\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    stream.read_to_end(&mut resp).await.unwrap();
    String::from_utf8_lossy(&resp).into_owned()
}

/// Sends a GET of `target` byte for byte and returns the status and the whole answer.
async fn raw_status(addr: SocketAddr, target: &str) -> (u16, String) {
    let text = raw_asked(addr, "GET", target).await;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn serves_files_index_and_ranges() {
    let (_proxy, addr, _root, _) = start();
    let (status, headers, body) = http_get(addr, "/a.txt", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(&body[..], CONTENT.as_bytes());
    assert_eq!(headers["content-type"], "text/plain");
    assert!(headers.contains_key("etag") && headers.contains_key("last-modified"));

    let (status, headers, body) = http_get(addr, "/a.txt", &[("range", "bytes=10-19")]).await;
    assert_eq!(status, 206);
    assert_eq!(&body[..], b"abcdefghij");
    assert_eq!(headers["content-range"], "bytes 10-19/36");
    let (status, _, body) = http_get(addr, "/a.txt", &[("range", "bytes=-3")]).await;
    assert_eq!((status.as_u16(), &body[..]), (206, &b"xyz"[..]));
    let (status, _, _) = http_get(addr, "/a.txt", &[("range", "bytes=99-")]).await;
    assert_eq!(status, 416);

    let (status, _, body) = http_get(addr, "/", &[]).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"<h1>home</h1>"[..]));
    let (status, _, body) = http_get(addr, "/sub/", &[]).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"<h1>sub</h1>"[..]));
    let (status, _, _) = http_get(addr, "/empty/", &[]).await;
    assert_eq!(status, 404, "a folder without index.html is never listed");
}

#[tokio::test]
async fn conditional_requests_answer_304() {
    let (_proxy, addr, _root, www) = start();
    let (_, headers, _) = http_get(addr, "/a.txt", &[]).await;
    let etag = headers["etag"].to_str().unwrap().to_string();
    let modified = headers["last-modified"].to_str().unwrap().to_string();
    assert!(etag.starts_with('"'), "a strong tag, as nginx's: {etag}");

    let (status, headers, body) = http_get(addr, "/a.txt", &[("if-none-match", &etag)]).await;
    assert_eq!(status, 304);
    assert!(body.is_empty());
    assert_eq!(headers["etag"], etag.as_str());
    let list = format!("\"other\", {etag}");
    let (status, _, _) = http_get(addr, "/a.txt", &[("if-none-match", &list)]).await;
    assert_eq!(status, 304);
    let (status, _, body) = http_get(addr, "/a.txt", &[("if-none-match", "\"stale\"")]).await;
    assert_eq!(status, 200);
    assert_eq!(&body[..], CONTENT.as_bytes());
    // If-None-Match wins over If-Modified-Since (RFC 9110 §13.1.3).
    let both = [
        ("if-none-match", "\"stale\""),
        ("if-modified-since", modified.as_str()),
    ];
    let (status, _, _) = http_get(addr, "/a.txt", &both).await;
    assert_eq!(status, 200);
    let (status, headers, _) = http_get(addr, "/a.txt", &[("if-modified-since", &modified)]).await;
    assert_eq!(status, 304);
    // With the validators a 200 carries (RFC 9110 §15.4.5): it had none.
    assert_eq!(
        headers.get("etag").map(|v| v.to_str().unwrap()),
        Some(etag.as_str())
    );
    assert_eq!(headers["last-modified"], modified.as_str());

    std::fs::write(www.join("a.txt"), "changed, and longer than before").unwrap();
    let (status, headers, _) = http_get(addr, "/a.txt", &[("if-none-match", &etag)]).await;
    assert_eq!(status, 200, "a changed file must not match the old tag");
    assert_ne!(headers["etag"], etag.as_str());
}

#[tokio::test]
async fn never_escapes_the_folder_or_shows_dotfiles() {
    let (_proxy, addr, _root, www) = start();
    for target in [
        "/../outside.txt",
        "/../../../../etc/passwd",
        "/%2e%2e/outside.txt",
        "/%2E%2E/%2e%2e/etc/passwd",
        "/sub/..%2f..%2foutside.txt",
        "/..%5c..%5coutside.txt",
        "/%252e%252e/outside.txt",
    ] {
        let (status, text) = raw_status(addr, target).await;
        assert!(
            [400, 404].contains(&status),
            "{target} answered {status}:\n{text}"
        );
        assert!(
            !text.contains("outside") && !text.contains("root:"),
            "{target} leaked"
        );
    }
    // Links with visible names to dotfiles lead where their names could not.
    std::os::unix::fs::symlink(www.join(".env"), www.join("env.txt")).unwrap();
    std::os::unix::fs::symlink(www.join(".git"), www.join("git")).unwrap();
    for target in [
        "/.env",
        "/.git/config",
        "/%2eenv",
        "/sub/../.env",
        "/.git/",
        "/env.txt",
        "/git/config",
    ] {
        let (status, text) = raw_status(addr, target).await;
        assert_eq!(status, 404, "{target}:\n{text}");
        assert!(
            !text.contains("SECRET") && !text.contains("[core]"),
            "{target} leaked"
        );
    }
    let (status, _) = raw_status(addr, "/a.txt").await;
    assert_eq!(
        status, 200,
        "the checks above must not pass by refusing everything"
    );
}

#[tokio::test]
async fn file_server_connections_have_their_own_cap() {
    let (_root, www) = files();
    let proxy = serving(&www, "file_server_max_connections: 2");
    let addr = file_server_addr(&proxy);
    // Two connections with half a request head each hold both places (sent bytes: the
    // listener defers accepts until a connection's first ones)...
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        held.push(half);
    }
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    third
        .write_all(b"GET / HTTP/1.1\r\nHost: files\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), third.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a third connection was kept: {read:?}"
    );
    // ...while the proxy's own listener still answers.
    let mut client = Client::connect(Proto::H1, proxy.addr).await;
    assert!(client.get("any", "/").await.status().as_u16() > 0);
    // The refusal is said at the default level (it was at debug only).
    let said = "file server: connection refused: its connection cap (2) is reached";
    proxy
        .wait_log(said, std::time::Duration::from_secs(5))
        .await;
}

/// Ranges and preconditions `ServeDir` got wrong (RFC 9110 §13, §14): a stale `If-Range` got a
/// 206 of the new file (a resumed download then mixed two versions), `If-Match` and
/// `If-Unmodified-Since` were ignored, a suffix past the file, an unknown unit or several ranges
/// were a 416, an empty file's range a `bytes 0-0/0` 206, and `/a.txt/` served the file.
#[tokio::test]
async fn ranges_and_preconditions_follow_rfc_9110() {
    let (_proxy, addr, _root, www) = start();
    std::fs::write(www.join("empty.txt"), "").unwrap();
    let (_, headers, _) = http_get(addr, "/a.txt", &[]).await;
    let modified = headers["last-modified"].to_str().unwrap().to_string();
    let etag = headers["etag"].to_str().unwrap().to_string();
    let weak = format!("W/{etag}");
    let range = ("range", "bytes=0-1");
    for (asked, want, body) in [
        (vec![range, ("if-range", "\"zzz\"")], 200, CONTENT),
        // The file's own tag resumes a download; the same tag weakened never matches.
        (vec![range, ("if-range", etag.as_str())], 206, "01"),
        (vec![range, ("if-range", weak.as_str())], 200, CONTENT),
        (vec![("if-match", etag.as_str())], 200, CONTENT),
        (
            vec![("if-match", weak.as_str())],
            412,
            "412 Precondition Failed\n",
        ),
        (
            vec![range, ("if-range", "Sat, 01 Jan 2000 00:00:00 GMT")],
            200,
            CONTENT,
        ),
        (vec![range, ("if-range", modified.as_str())], 206, "01"),
        (vec![("range", "bytes=-100")], 206, CONTENT),
        (vec![("range", "items=1-2")], 200, CONTENT),
        (vec![("range", "BYTES=1-2")], 206, "12"),
        (vec![("range", "bytes=0-1,3-4")], 200, CONTENT),
        (
            vec![("if-match", "\"zz\"")],
            412,
            "412 Precondition Failed\n",
        ),
        (vec![("if-match", "*")], 200, CONTENT),
        (
            vec![("if-unmodified-since", "Sat, 01 Jan 2000 00:00:00 GMT")],
            412,
            "412 Precondition Failed\n",
        ),
        (
            vec![("if-unmodified-since", modified.as_str())],
            200,
            CONTENT,
        ),
    ] {
        let (status, _, got) = http_get(addr, "/a.txt", &asked).await;
        assert_eq!(
            (status.as_u16(), &got[..]),
            (want, body.as_bytes()),
            "{asked:?}"
        );
    }
    // A folder's index.html answers its preconditions too (`If-Match` was ignored on `/sub/`).
    let (status, _, _) = http_get(addr, "/sub/", &[("if-match", "\"zz\"")]).await;
    assert_eq!(status.as_u16(), 412);
    let (status, _, got) = http_get(addr, "/empty.txt", &[("range", "bytes=0-")]).await;
    assert_eq!((status.as_u16(), got.len()), (200, 0));
    assert_eq!(raw_status(addr, "/a.txt/").await.0, 404);
}

/// A method other than GET and HEAD is a 405 that says which are allowed (RFC 9110 §15.5.6).
#[tokio::test]
async fn other_methods_get_a_405_that_names_the_allowed_ones() {
    let (_proxy, addr, _root, _) = start();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req =
        b"PUT /a.txt HTTP/1.1\r\nHost: files\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    stream.write_all(req).await.unwrap();
    let mut resp = Vec::new();
    stream.read_to_end(&mut resp).await.unwrap();
    let text = String::from_utf8_lossy(&resp).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 405"), "{text}");
    assert!(text.contains("\r\nallow: get, head\r\n"), "{text}");
}

/// A folder that is a symbolic link switched to another release while serving (`current ->
/// releases/2`, as deployments do): what is checked and what is served are both the new
/// release's. The checks used to look in the release of the start, so a link out of the folder
/// in the new one was followed (`/pw.txt` served the file outside), and ranges were worked out
/// on the old file's size.
#[tokio::test]
async fn a_folder_switched_to_another_release_is_checked_where_it_leads() {
    let root = tempfile::tempdir().unwrap();
    let (one, two) = (root.path().join("r1"), root.path().join("r2"));
    std::fs::create_dir_all(&one).unwrap();
    std::fs::create_dir_all(&two).unwrap();
    std::fs::write(root.path().join("outside.txt"), "outside").unwrap();
    std::fs::write(one.join("f.txt"), "0123456789").unwrap();
    std::fs::write(two.join("f.txt"), "abcdefghijklmnopqrst").unwrap();
    std::os::unix::fs::symlink(root.path().join("outside.txt"), two.join("pw.txt")).unwrap();
    let current = root.path().join("current");
    std::os::unix::fs::symlink(&one, &current).unwrap();
    let proxy = ProxyProcess::start(
        &unused_route(),
        &format!(
            "file_server_folder: \"{}\"\nfile_server_address: \"127.0.0.1:0\"",
            current.display()
        ),
    );
    let addr = file_server_addr(&proxy);
    assert_eq!(raw_status(addr, "/f.txt").await.0, 200);
    // The switch: a new link renamed over the old one.
    let next = root.path().join("current.next");
    std::os::unix::fs::symlink(&two, &next).unwrap();
    std::fs::rename(&next, &current).unwrap();
    std::fs::remove_dir_all(&one).unwrap();
    let (status, text) = raw_status(addr, "/pw.txt").await;
    assert_eq!(status, 404, "{text}");
    assert!(
        !text.contains("outside"),
        "a link out of the folder was followed"
    );
    let client = ranged_get(addr, "/f.txt", "bytes=-15").await;
    assert!(client.starts_with("HTTP/1.1 206"), "{client}");
    assert!(client.contains("content-range: bytes 5-19/20"), "{client}");
    assert!(client.ends_with("fghijklmnopqrst"), "{client}");
}

/// Paths are read as routing reads them: `//sub` is `/sub` (redirected to `/sub/` on this
/// host, not to `//sub/`, which a browser takes for another host), and `/sub/../a.txt` is
/// `/a.txt` (it got a 404).
#[tokio::test]
async fn paths_are_normalised_before_they_are_served() {
    let (_proxy, addr, _root, _www) = start();
    let (status, text) = raw_status(addr, "//sub").await;
    assert!((300..400).contains(&status), "{text}");
    let location = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("location: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    assert_eq!(location, "/sub/", "{text}");
    let (status, text) = raw_status(addr, "/sub/../a.txt").await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with(CONTENT), "{text}");
    let (status, _) = raw_status(addr, "/sub/../.env").await;
    assert_eq!(status, 404);
    // A `%` that escapes nothing makes no path (400, as the proxy and nginx answer).
    std::fs::write(_www.join("100%.txt"), CONTENT).unwrap();
    for target in ["/100%.txt", "/a%2.txt", "/%zz"] {
        let (status, text) = raw_status(addr, target).await;
        assert_eq!(status, 400, "{target}: {text}");
    }
}

/// A file that grows while it is sent: the answer ends at the length its head declared, and
/// the connection serves the next request (as nginx's). The bytes past it broke the
/// connection, and the answer lost its last chunk.
#[tokio::test]
async fn a_file_growing_while_sent_ends_at_its_declared_length() {
    let (proxy, addr, _root, www) = start();
    // Not a whole number of the reader's 64 KiB chunks: its last one is read past the length.
    const SIZE: usize = (32 << 20) + 1000;
    std::fs::write(www.join("grow.bin"), vec![b'x'; SIZE]).unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let ask = |target: &str| format!("GET {target} HTTP/1.1\r\nHost: files\r\n\r\n");
    stream.write_all(ask("/grow.bin").as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 16 << 10];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the head");
        got.extend_from_slice(&chunk[..n]);
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
    assert!(head.contains(&format!("content-length: {SIZE}")), "{head}");
    // Most of the file is still to be read when it grows.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(www.join("grow.bin"))
        .unwrap();
    std::io::Write::write_all(&mut file, &[b'y'; 100 << 10]).unwrap();
    let mut body = got.split_off(head_end);
    while body.len() < SIZE {
        let mut chunk = vec![0u8; 256 << 10];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "cut after {} of {SIZE} bytes", body.len());
        body.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(body.len(), SIZE, "bytes past the declared length");
    assert!(body.iter().all(|&b| b == b'x'));
    stream.write_all(ask("/a.txt").as_bytes()).await.unwrap();
    let mut next = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut next))
        .await
        .expect("the next answer")
        .unwrap();
    let next = String::from_utf8_lossy(&next[..n]);
    assert!(
        next.starts_with("HTTP/1.1 200"),
        "{next}\n{}",
        proxy.log_text()
    );
}

/// Sends a GET for `target` with `Range: range`, and returns the whole answer.
async fn ranged_get(addr: SocketAddr, target: &str, range: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: files\r\nRange: {range}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    stream.read_to_end(&mut resp).await.unwrap();
    String::from_utf8_lossy(&resp).into_owned()
}

/// A folder's `index.html` that is a link out of the folder is not served (it was: the check
/// looked only at whether it was a regular file), and a name too long for the file system is a
/// 404 (it was a 500).
#[tokio::test]
async fn an_index_linked_out_and_a_name_too_long_are_404s() {
    let (_proxy, addr, root, www) = start();
    std::fs::create_dir(www.join("esc")).unwrap();
    let outside = root.path().join("outside.txt");
    std::os::unix::fs::symlink(&outside, www.join("esc/index.html")).unwrap();
    for target in ["/esc/", "/esc/index.html"] {
        let (status, text) = raw_status(addr, target).await;
        assert_eq!(status, 404, "{target}:\n{text}");
        assert!(!text.contains("outside"), "{target} leaked");
    }
    let (status, text) = raw_status(addr, "/esc").await;
    assert_eq!(status, 307, "{text}");
    assert!(text.contains("location: /esc/"), "{text}");
    // A folder linked out is not even redirected to.
    std::os::unix::fs::symlink("/etc", www.join("etc")).unwrap();
    for target in ["/etc", "/etc/", "/etc/passwd"] {
        assert_eq!(raw_status(addr, target).await.0, 404, "{target}");
    }
    for target in ["/".to_string() + &"b".repeat(256), "/a".repeat(3000)] {
        let (status, _) = raw_status(addr, &target).await;
        assert_eq!(status, 404, "{} bytes", target.len());
    }
}

/// The file served is the one checked: a link swapped between a file inside and one outside
/// while it is asked for (another process renaming links into place) never serves the outside
/// one, and a FIFO swapped in never holds a thread (it served the outside file about one time
/// in seven, and each FIFO opened held one of the blocking pool's threads for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_swapped_while_asked_for_serves_only_what_was_checked() {
    let (_proxy, addr, root, www) = start();
    let (inside, outside) = (www.join("a.txt"), root.path().join("outside.txt"));
    let fifo = root.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let swapping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let swapper = {
        let (swapping, www) = (swapping.clone(), www.clone());
        std::thread::spawn(move || {
            let (target, spare) = (www.join("race.txt"), www.join("race.next"));
            let mut turn = 0u64;
            while swapping.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::remove_file(&spare);
                let lead = [&inside, &outside, &fifo][(turn % 3) as usize];
                let _ = std::os::unix::fs::symlink(lead, &spare);
                let _ = std::fs::rename(&spare, &target);
                turn += 1;
            }
        })
    };
    let mut served = 0;
    for _ in 0..300 {
        let asked = raw_status(addr, "/race.txt");
        let (status, text) = tokio::time::timeout(std::time::Duration::from_secs(5), asked)
            .await
            .expect("an answer: no request waits on a FIFO");
        assert!(!text.contains("outside"), "the outside file was served");
        served += usize::from(status == 200);
    }
    swapping.store(false, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(
        served > 0,
        "the inside file is served when the link leads to it"
    );
}

/// The file server's requests are in the access log, as the proxy's are (they were in none).
#[tokio::test]
async fn file_server_requests_are_in_the_access_log() {
    let (_root, www) = files();
    let proxy = serving(&www, "access_log: all");
    let addr = file_server_addr(&proxy);
    // Asked through the proxy, which sends its request id: the file server's line carries it,
    // so the two lines can be matched (it wrote `request_id=-`).
    let (status, _, body) = http_get(addr, "/a.txt?unique123", &[("x-request-id", "rid-42")]).await;
    assert_eq!((status.as_u16(), body.len()), (200, CONTENT.len()));
    assert_eq!(raw_status(addr, "/missing.txt").await.0, 404);
    proxy
        .wait_log("target=\"/missing.txt\"", std::time::Duration::from_secs(5))
        .await;
    let log = proxy.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("unique123"))
        .expect("logged");
    let bytes = format!(" status=200 bytes={} ", CONTENT.len());
    assert!(line.contains(&bytes), "{line}");
    assert!(line.contains(" request_id=rid-42 "), "{line}");
}

/// A HEAD gets the length its GET would, on the file server's own answers (a 404 said none)
/// as on files.
#[tokio::test]
async fn a_head_of_the_servers_own_answers_says_their_length() {
    let (_proxy, addr, _root, _) = start();
    for (target, status, length) in [("/missing.txt", 404, 14), ("/a.txt", 200, CONTENT.len())] {
        let answer = raw_asked(addr, "HEAD", target).await.to_ascii_lowercase();
        assert!(
            answer.starts_with(&format!("http/1.1 {status}")),
            "{answer}"
        );
        assert!(
            answer.contains(&format!("content-length: {length}\r\n")),
            "{answer}"
        );
        assert!(answer.ends_with("\r\n\r\n"), "a HEAD has no body: {answer}");
    }
}

/// A file that shrinks while it is sent: the answer is cut where the file ended, the connection
/// closes (the client sees fewer bytes than declared, as with nginx), and the warning names the
/// file and the client. Nothing said so before.
#[tokio::test]
async fn a_file_shrinking_while_sent_is_cut_and_said() {
    let (proxy, addr, _root, www) = start();
    const SIZE: usize = (32 << 20) + 1000;
    std::fs::write(www.join("shrink.bin"), vec![b'x'; SIZE]).unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let ask = "GET /shrink.bin HTTP/1.1\r\nHost: files\r\n\r\n";
    stream.write_all(ask.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut chunk = [0u8; 16 << 10];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the head");
        got.extend_from_slice(&chunk[..n]);
    }
    // Most of the file is still to be read when it shrinks to 1 MiB.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(www.join("shrink.bin"))
        .unwrap();
    file.set_len(1 << 20).unwrap();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut got),
    );
    assert!(read.await.is_ok(), "the connection was not closed");
    assert!(got.len() < SIZE, "{} bytes", got.len());
    let said = "file server: \"/shrink.bin\" for 127.0.0.1 ended";
    proxy
        .wait_log(said, std::time::Duration::from_secs(5))
        .await;
}

/// A file dated before 1970 (`touch -d @-1`, or from an archive) is served, dated the epoch:
/// tower-http's file service dated it with a `httpdate` that panicked on it, and the release
/// build's abort took the whole proxy down at its first request.
#[tokio::test]
async fn a_file_dated_before_1970_is_served_and_the_proxy_lives_on() {
    let (mut proxy, addr, _root, www) = start();
    let old = std::fs::File::create(www.join("old.txt")).unwrap();
    std::io::Write::write_all(&mut &old, b"from before").unwrap();
    let before_epoch = std::time::UNIX_EPOCH - std::time::Duration::from_secs(1);
    old.set_modified(before_epoch).unwrap();
    let epoch = "Thu, 01 Jan 1970 00:00:00 GMT";
    let (status, headers, body) = http_get(addr, "/old.txt", &[]).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"from before"[..]));
    assert_eq!(headers["last-modified"], epoch);
    let (status, headers, _) = http_get(addr, "/old.txt", &[("if-modified-since", epoch)]).await;
    assert_eq!(status, 304);
    assert_eq!(headers["last-modified"], epoch);
    let (status, _, _) = http_get(addr, "/a.txt", &[]).await;
    assert_eq!(status, 200);
    assert!(
        proxy.wait_exit(std::time::Duration::ZERO).is_none(),
        "{}",
        proxy.log_text()
    );
}
