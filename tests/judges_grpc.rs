//! The official gRPC interop suite (grpc-go's `interop/client` and `interop/server`, installed by
//! `scripts/install-judges.sh`) through the real binary: the 14 standard cases, empty_unary to
//! unimplemented_service, from the client through the proxy's TLS listener and through h2c on
//! its plain listener, to an interop server that speaks TLS and to one that speaks h2c. The
//! backends are named without a scheme, so the proxy detects each one's protocol. Every failing
//! combination is printed with the client's own words.

use crate::support;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::ports::free_port;
use support::tools::{find, run, Tool};
use support::*;

const CLIENT: Tool = Tool {
    env: "ARALEZ_GRPC_INTEROP_CLIENT",
    installed: "target/judges/bin/grpc-interop-client",
    on_path: &["grpc-interop-client"],
};
const SERVER: Tool = Tool {
    env: "ARALEZ_GRPC_INTEROP_SERVER",
    installed: "target/judges/bin/grpc-interop-server",
    on_path: &["grpc-interop-server"],
};

/// The standard cases every gRPC implementation's interop client runs (the ones needing cloud
/// credentials, ORCA or several servers left out).
const CASES: [&str; 14] = [
    "empty_unary",
    "large_unary",
    "client_streaming",
    "server_streaming",
    "ping_pong",
    "empty_stream",
    "timeout_on_sleeping_server",
    "cancel_after_begin",
    "cancel_after_first_response",
    "status_code_and_message",
    "special_status_message",
    "custom_metadata",
    "unimplemented_method",
    "unimplemented_service",
];

/// A running interop server, killed on drop.
struct InteropServer {
    child: Child,
    addr: SocketAddr,
}

impl Drop for InteropServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the interop server, with TLS when `tls` names its certificate and key.
fn start_server(program: &Path, tls: Option<(&Path, &Path)>) -> InteropServer {
    let port = free_port();
    let mut command = Command::new(program);
    command.arg(format!("-port={port}"));
    if let Some((cert, key)) = tls {
        command.args([
            "-use_tls=true".to_string(),
            format!("-tls_cert_file={}", cert.display()),
            format!("-tls_key_file={}", key.display()),
        ]);
    }
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let server = InteropServer { child, addr };
    let up = eventually_blocking(Duration::from_secs(20), || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
    });
    assert!(up, "the interop server did not listen on {addr}");
    server
}

/// One way in: the proxy's listener and how the client talks to it.
struct Entry {
    name: &'static str,
    addr: SocketAddr,
    tls: bool,
}

/// Runs one case; `None` when it passed, else what the client said.
async fn run_case(client: &Path, entry: &Entry, ca_file: &Path, case: &str) -> Option<String> {
    let mut args = vec![
        "-server_host=127.0.0.1".to_string(),
        format!("-server_port={}", entry.addr.port()),
        format!("-test_case={case}"),
    ];
    if entry.tls {
        args.extend([
            "-use_tls=true".to_string(),
            "-use_test_ca=true".to_string(),
            format!("-ca_file={}", ca_file.display()),
            "-server_host_override=localhost".to_string(),
        ]);
    }
    let dir = tempfile::tempdir().expect("work dir");
    let done = run(
        client.to_path_buf(),
        args,
        dir.path().into(),
        Duration::from_secs(60),
    )
    .await;
    if done.code == Some(0) {
        return None;
    }
    let said: Vec<&str> = done.stderr.lines().rev().take(6).collect();
    Some(format!(
        "exit {:?}: {}",
        done.code,
        said.into_iter().rev().collect::<Vec<_>>().join(" | ")
    ))
}

/// Certificates: the proxy's (in its certificate directory), the TLS backend's, and the CA the
/// client trusts.
struct Pki {
    dir: tempfile::TempDir,
    proxy_certs: PathBuf,
    backend_cert: PathBuf,
    backend_key: PathBuf,
    ca_file: PathBuf,
}

fn write_pki() -> Pki {
    let dir = tempfile::tempdir().expect("temp dir");
    let proxy_certs = dir.path().join("certs");
    std::fs::create_dir(&proxy_certs).expect("cert dir");
    let proxy = test_pki(&["localhost", "127.0.0.1"]);
    std::fs::write(proxy_certs.join("default.crt"), &proxy.leaf_pem).expect("write crt");
    std::fs::write(proxy_certs.join("default.key"), &proxy.leaf_key_pem).expect("write key");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &proxy.ca_pem).expect("write CA");
    let backend = test_pki(&["localhost", "127.0.0.1"]);
    let backend_cert = dir.path().join("backend.crt");
    let backend_key = dir.path().join("backend.key");
    std::fs::write(&backend_cert, &backend.leaf_pem).expect("write backend crt");
    std::fs::write(&backend_key, &backend.leaf_key_pem).expect("write backend key");
    Pki {
        dir,
        proxy_certs,
        backend_cert,
        backend_key,
        ca_file,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_interop_cases_pass_through_both_listeners_to_detected_tls_and_h2c_backends() {
    let (Some(client), Some(server)) = (find(&CLIENT), find(&SERVER)) else {
        return;
    };
    let pki = write_pki();
    let mut failures = Vec::new();
    let mut passed = 0;
    for backend_tls in [true, false] {
        let tls_files = backend_tls.then_some((&*pki.backend_cert, &*pki.backend_key));
        let backend = start_server(&server, tls_files);
        let main = format!(
            "proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: \"{}\"",
            pki.proxy_certs.display()
        );
        let proxy = ProxyProcess::start(&default_route_to(&[backend.addr]), &main);
        let entries = [
            Entry {
                name: "TLS listener",
                addr: proxy.logged_addr("listening on https://"),
                tls: true,
            },
            Entry {
                name: "h2c on the plain listener",
                addr: proxy.addr,
                tls: false,
            },
        ];
        let backend_kind = if backend_tls { "TLS" } else { "h2c" };
        for entry in &entries {
            for case in CASES {
                match run_case(&client, entry, &pki.ca_file, case).await {
                    None => passed += 1,
                    Some(why) => failures.push(format!(
                        "{case} via the {} to the {backend_kind} backend: {why}",
                        entry.name
                    )),
                }
            }
        }
    }
    drop(pki.dir);
    eprintln!(
        "gRPC interop: {passed} of {} case runs passed",
        CASES.len() * 4
    );
    assert!(
        failures.is_empty(),
        "gRPC interop failures:\n{}",
        failures.join("\n")
    );
}
