//! slowhttptest (Debian's package, installed by `scripts/install-judges.sh`) against the real
//! binary with its default timeouts: slowloris (request heads sent a line every 10 s), slow body
//! (a POST body sent a few bytes every 10 s) and slow read (a 10 MB answer read a byte at a time
//! through a one-byte window), 300 connections each, all three at once for 30 s. Meanwhile a
//! probe opens a fresh connection every 250 ms and must be answered within 2 s every time, and
//! slowhttptest's own probe must find the service available every second. The proxy's RSS and
//! the bytes the kernel queues on its sockets for sending must stay bounded. How many slow
//! connections the proxy closed by itself is printed per attack (from slowhttptest's CSV).

use crate::support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::tools::{find, run_blocking, Run, Tool};
use support::*;

const SLOWHTTPTEST: Tool = Tool {
    env: "ARALEZ_SLOWHTTPTEST",
    installed: "/usr/bin/slowhttptest", // Debian's package
    on_path: &["slowhttptest"],
};

const CONNECTIONS: &str = "300";
const SECONDS: u64 = 30;

/// One attack: its name, slowhttptest's mode flags and the path it targets.
struct Attack {
    name: &'static str,
    flags: &'static [&'static str],
    path: &'static str,
}

const ATTACKS: [Attack; 3] = [
    Attack {
        name: "slowloris",
        flags: &["-H", "-i", "10", "-s", "8192", "-t", "GET"],
        path: "/",
    },
    Attack {
        name: "slow-body",
        flags: &["-B", "-i", "10", "-s", "8192", "-t", "POST"],
        path: "/echo",
    },
    Attack {
        name: "slow-read",
        flags: &["-X", "-w", "1", "-y", "2", "-n", "5", "-z", "1", "-k", "3"],
        path: "/big/10000000",
    },
];

fn args(attack: &Attack, proxy: SocketAddr) -> Vec<String> {
    let seconds = SECONDS.to_string();
    let common = [
        "-c",
        CONNECTIONS,
        "-r",
        CONNECTIONS,
        "-l",
        &seconds,
        "-p",
        "3",
        "-g",
        "-o",
        attack.name,
    ];
    let url = format!("http://{proxy}{}", attack.path);
    attack
        .flags
        .iter()
        .chain(common.iter())
        .map(|s| s.to_string())
        .chain(["-u".to_string(), url])
        .collect()
}

/// slowhttptest's per-second statistics: (closed, connected, service available) for each row.
fn read_csv(path: &Path, run: &Run) -> Vec<(u64, u64, bool)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "no CSV at {} ({e}); exit {:?}, stdout:\n{}\nstderr:\n{}",
            path.display(),
            run.code,
            run.stdout,
            run.stderr
        )
    });
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split(',').map(str::trim).collect();
            let closed = cols.get(1)?.parse().ok()?;
            let connected = cols.get(3)?.parse().ok()?;
            let available = cols.get(4)?.parse::<u64>().ok()? > 0;
            Some((closed, connected, available))
        })
        .collect()
}

/// What the probe saw: how many it sent, the ones not answered 200 within 2 s (with what
/// happened), the slowest answer and how long after the probing began it was asked, the proxy's
/// largest RSS meanwhile in KiB and the most bytes its sockets' kernel send queues held at once.
struct Probed {
    sent: usize,
    failed: Vec<String>,
    slowest: Duration,
    slowest_asked_at: Duration,
    peak_rss_kib: u64,
    peak_send_queued: u64,
}

/// The bytes queued in the kernel for sending on `pid`'s TCP sockets (not yet sent, or not yet
/// acknowledged: the `tx_queue` of /proc/net/tcp), summed. Kernel memory, not in the RSS.
fn send_queued_bytes(pid: u32) -> u64 {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?.strip_prefix("socket:[")?;
            Some(target.strip_suffix(']')?.to_string())
        })
        .collect();
    let queued = |table: &str| -> u64 {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        text.lines()
            .skip(1)
            .filter_map(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                // A listening socket's (state 0A) queue columns count connections, not bytes.
                if cols.get(3) == Some(&"0A") || !inodes.contains(*cols.get(9)?) {
                    return None;
                }
                u64::from_str_radix(cols.get(4)?.split(':').next()?, 16).ok()
            })
            .sum()
    };
    queued("/proc/net/tcp") + queued("/proc/net/tcp6")
}

/// Waits (at least 1 s, at most 10 s) until the attacks' opening burst is over, and says how long
/// that took. The slow readers' 300 ten-megabyte answers stream at full speed until their windows
/// close and the bounded send queues fill: about 40 MiB copied through the proxy (a debug build
/// here) and as much made by the test's own backend, a burst of work any proxy does once, during
/// which a probe waited up to 2 s on a loaded 2-core machine. Over when the bytes queued on the
/// proxy's and the backend's sockets grow by under 2 % in 250 ms.
async fn attacks_settled(proxy: u32) -> Duration {
    let begun = Instant::now();
    let queued = || send_queued_bytes(proxy) + send_queued_bytes(std::process::id());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut last = queued();
    while begun.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = queued();
        if last > 0 && now <= last + last / 50 {
            break;
        }
        last = now;
    }
    begun.elapsed()
}

/// A fresh connection every 250 ms for `how_long`.
async fn probe(proxy: &ProxyProcess, how_long: Duration) -> Probed {
    let end = Instant::now() + how_long;
    let (mut sent, mut failed, mut peak_rss_kib, mut peak_send_queued) = (0, Vec::new(), 0, 0);
    let begun = Instant::now();
    let (mut slowest, mut slowest_asked_at) = (Duration::ZERO, Duration::ZERO);
    while Instant::now() < end {
        peak_rss_kib = peak_rss_kib.max(proxy.rss_kib());
        if sent % 4 == 0 {
            // Once a second: reading every socket of the machine is not free.
            peak_send_queued = peak_send_queued.max(send_queued_bytes(proxy.pid()));
        }
        let proxy = proxy.addr;
        sent += 1;
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(2), async {
            let mut c = Client::connect(Proto::H1, proxy).await;
            c.get("probe", "/").await.status()
        })
        .await;
        if started.elapsed() > slowest {
            (slowest, slowest_asked_at) = (started.elapsed(), started - begun);
        }
        match answer {
            Ok(status) if status == 200 => {}
            Ok(status) => failed.push(format!("{status} after {:?}", started.elapsed())),
            Err(_) => failed.push(format!("no answer at {:?}", started.elapsed())),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Probed {
        sent,
        failed,
        slowest,
        slowest_asked_at,
        peak_rss_kib,
        peak_send_queued,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_slow_body_and_slow_read_at_once_leave_the_proxy_answering() {
    let Some(program) = find(&SLOWHTTPTEST) else {
        return;
    };
    // HTTP/1.1 to the backend: a connection upstream for each slow client, the costlier case.
    let backend = Backend::builder("b").h1_only().start().await;
    let proxy = ProxyProcess::start(&default_route(&[&backend]), "");
    let work = tempfile::tempdir().expect("work dir");
    let limit = Duration::from_secs(SECONDS + 60);
    let attacks: Vec<_> = ATTACKS
        .iter()
        .map(|attack| {
            let (program, args) = (program.clone(), args(attack, proxy.addr));
            let dir: PathBuf = work.path().to_path_buf();
            std::thread::spawn(move || run_blocking(&program, &args, &dir.clone(), limit))
        })
        .collect();
    // Probe the siege, not its opening burst: let the attacks open their connections and the
    // slow readers' answers fill what they can, then probe until the attacks end.
    let ramp = attacks_settled(proxy.pid()).await;
    let idle_rss = proxy.rss_kib();
    // The probe is a client of its own, like slowhttptest's: its own thread and runtime, not
    // queued behind the backend's tasks (which write 300 ten-megabyte answers meanwhile).
    let probed = std::thread::scope(|scope| {
        let probing = scope.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("probe runtime")
                .block_on(probe(
                    &proxy,
                    Duration::from_secs(SECONDS - 2).saturating_sub(ramp),
                ))
        });
        probing.join().expect("probe thread")
    });
    let runs: Vec<Run> = attacks
        .into_iter()
        .map(|t| t.join().expect("slowhttptest thread"))
        .collect();

    let mut unavailable = Vec::new();
    for (attack, run) in ATTACKS.iter().zip(&runs) {
        let rows = read_csv(&work.path().join(format!("{}.csv", attack.name)), run);
        let peak = rows.iter().map(|r| r.1).max().unwrap_or(0);
        let closed = rows.last().map_or(0, |r| r.0);
        let down = rows.iter().filter(|r| !r.2).count();
        eprintln!(
            "slowhttptest {}: {CONNECTIONS} connections, peak {peak} connected, {closed} closed by the proxy within {SECONDS} s, service unavailable in {down} of {} seconds",
            attack.name,
            rows.len()
        );
        assert!(
            peak > 0,
            "{}: slowhttptest never connected:\n{}",
            attack.name,
            run.stdout
        );
        if down > 0 {
            unavailable.push(format!("{}: {down} seconds", attack.name));
        }
    }
    eprintln!(
        "probe: from {ramp:?} after the attacks began, {} of {} fresh connections answered within 2 s (the slowest in {:?}, asked {:?} after probing began); proxy RSS {} KiB at the start, {} KiB at most; its kernel send queues {} KiB at most",
        probed.sent - probed.failed.len(),
        probed.sent,
        probed.slowest,
        probed.slowest_asked_at,
        idle_rss,
        probed.peak_rss_kib,
        probed.peak_send_queued / 1024
    );
    assert!(
        probed.failed.is_empty(),
        "probes failed during the attacks: {:?}",
        probed.failed
    );
    // 900 slow connections, 300 of them with a 10 MB answer pending: what is buffered per
    // connection is bounded (a few socket and frame buffers), never the answer. (Measured: 120
    // MiB at most; 228 MiB when upstream reads could grow to hyper's 400 KiB default.)
    assert!(
        probed.peak_rss_kib < 192 * 1024,
        "the proxy grew to {} KiB under 900 slow connections",
        probed.peak_rss_kib
    );
    // Nor does the kernel hold the answer for them: each connection's unsent bytes are bounded
    // (TCP_NOTSENT_LOWAT, 128 KiB). Unbounded, the kernel let a slow reader's send queue grow
    // toward `tcp_wmem`'s maximum, 4 MiB: 323 MiB in all, against 38 MiB with the bound.
    assert!(
        probed.peak_send_queued < 160 << 20,
        "the proxy's kernel send queues held {} KiB under 900 slow connections",
        probed.peak_send_queued / 1024
    );
    assert!(
        unavailable.is_empty(),
        "slowhttptest found the service unavailable: {unavailable:?}"
    );
}
