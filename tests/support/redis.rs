//! A `redis-server` of the test's own (Debian's package, installed by the test command), on a
//! loopback port, killed on drop; and one command in RESP for checking what it holds.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::eventually_async;
use super::tools::Tool;

pub const REDIS_SERVER: Tool = Tool {
    env: "ARALEZ_REDIS_SERVER",
    installed: "/usr/bin/redis-server", // Debian's package
    on_path: &["redis-server"],
};

/// A redis-server of the test's own, killed on drop.
pub struct Redis {
    child: Child,
    pub port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Redis {
    pub async fn start(program: &std::path::Path, port: u16) -> Redis {
        let child = Command::new(program)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let redis = Redis { child, port };
        let up = eventually_async(Duration::from_secs(10), || async {
            command(port, &["PING"])
                .await
                .filter(|r| r.starts_with("+PONG"))
        });
        assert!(up.await.is_some(), "redis-server did not answer");
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

/// One command in RESP on a new connection; the reply's first line.
pub async fn command(port: u16, args: &[&str]) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.write_all(out.as_bytes()).await.ok()?;
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}
