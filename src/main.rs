//! The `aralez` command line: parses arguments and calls into the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

#[global_allocator]
static GLOBAL: aralez::allocator::Mimalloc = aralez::allocator::Mimalloc;

/// The optional parts of `--version`'s feature list, as this build has them.
#[cfg(feature = "http3")]
macro_rules! http3_feature {
    () => {
        ", HTTP/3 (QUIC)"
    };
}
#[cfg(not(feature = "http3"))]
macro_rules! http3_feature {
    () => {
        ""
    };
}
#[cfg(feature = "kubernetes")]
macro_rules! discovery_feature {
    () => {
        "Consul and Kubernetes discovery"
    };
}
#[cfg(not(feature = "kubernetes"))]
macro_rules! discovery_feature {
    () => {
        "Consul discovery"
    };
}

/// `aralez --version`: version, the commit built from, and what is compiled in.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ARALEZ_COMMIT"),
    ")\nfeatures: HTTP/1.1, HTTP/2 (h2c and ALPN)",
    http3_feature!(),
    ", TLS (rustls: TLS 1.2 and 1.3), WebSocket (also over HTTP/2), gRPC, ",
    discovery_feature!(),
    ", file server, admin API, Prometheus metrics; allocator mimalloc"
);

/// `aralez --help`, after the options: signals and environment variables.
const AFTER_HELP: &str = "\
Signals:
  TERM, INT   stop accepting, finish in-flight requests (grace_period_seconds), exit 0
  QUIT        the same drain, for the old process of a live upgrade (aralez -u)
  HUP         re-read upstreams.yaml, conf.d and the certificates
  USR1        reopen log_file and access_log_file (logrotate)
  USR2        ignored (nginx's binary upgrade is `aralez -u` here)

Environment:
  RUST_LOG                   overrides log_level (tracing filter syntax)
  JWT_KEY                    overrides master_key: for JWTs, sticky cookies and the admin API
  SSL_CERT_FILE, SSL_CERT_DIR  trust store for upstream_tls_verify
  NOTIFY_SOCKET              set by systemd (Type=notify): READY, STOPPING, MAINPID
  KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT_HTTPS, POD_NAMESPACE
                             in-cluster Kubernetes discovery
  ARALEZ_ACCESS_LOG_QUEUE    access log queue length (default 16384 lines)";

/// A fast reverse proxy that reads Aralez's main.yaml and upstreams.yaml.
#[derive(Parser, Debug)]
#[command(
    name = "aralez",
    version = VERSION,
    disable_version_flag = true,
    args_conflicts_with_subcommands = true,
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    conf: Conf,
    /// Run in the background (also `daemon: true` in main.yaml).
    #[arg(short = 'd', long)]
    daemon: bool,
    /// Take over the listening sockets of a running instance.
    #[arg(short = 'u', long)]
    upgrade: bool,
    /// Validate the configuration and exit (0 when valid, 1 otherwise).
    #[arg(short = 't', long)]
    test: bool,
    /// Print the version.
    #[arg(short = 'v', long = "version", action = ArgAction::Version)]
    version: Option<bool>,
}

/// `-c FILE`: the main.yaml every mode reads.
#[derive(Args, Debug)]
struct Conf {
    /// Path of main.yaml.
    #[arg(
        short = 'c',
        long = "conf",
        value_name = "FILE",
        default_value = "/etc/aralez/main.yaml"
    )]
    path: PathBuf,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate main.yaml, the upstreams file and conf.d; print every error and warning.
    CheckConfig {
        #[command(flatten)]
        conf: Conf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Exit 1 on warnings too.
        #[arg(long)]
        deny_warnings: bool,
    },
    /// Ask the running proxy for a response (a container HEALTHCHECK): exit 0 when it answers
    /// HTTP, 1 otherwise.
    Healthcheck {
        /// main.yaml, whose `proxy_address_http` is probed.
        #[command(flatten)]
        conf: Conf,
        /// Probe this http://host:port/path instead.
        #[arg(long)]
        url: Option<String>,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 3)]
        timeout: u64,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Text,
    Json,
}

fn check(conf: &std::path::Path, format: Format, deny_warnings: bool) -> ExitCode {
    use std::io::Write as _;
    let report = aralez::check::check(conf);
    let rendered = match format {
        Format::Text => aralez::check::render_text(&report),
        Format::Json => format!("{}\n", aralez::check::render_json(&report)),
    };
    // A full disk or a closed pipe (`| head`) is reported, not a panic (print! panics).
    let mut out = std::io::stdout().lock();
    if let Err(e) = out
        .write_all(rendered.as_bytes())
        .and_then(|()| out.flush())
    {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("check-config: cannot write the report: {e}");
        }
        return ExitCode::FAILURE;
    }
    if aralez::check::failed(&report, deny_warnings) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn healthcheck(conf: &std::path::Path, url: Option<&str>, timeout: u64) -> ExitCode {
    let limit = std::time::Duration::from_secs(timeout.clamp(1, 300));
    match aralez::process::probe::probe(conf, url, limit) {
        Ok(status) => {
            println!("healthy: {status}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("unhealthy: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // First of all: a reload or log reopen asked as the process begins must not end it.
    aralez::process::hold_signals_until_handled();
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::CheckConfig {
            conf,
            format,
            deny_warnings,
        }) => return check(&conf.path, *format, *deny_warnings),
        Some(Command::Healthcheck { conf, url, timeout }) => {
            return healthcheck(&conf.path, url.as_deref(), *timeout)
        }
        None => {}
    }
    if cli.test {
        return check(&cli.conf.path, Format::Text, false);
    }
    let options = aralez::process::RunOptions {
        daemon: cli.daemon,
        upgrade: cli.upgrade,
    };
    // Fork (when asked) before anything starts a thread.
    let mut ready = match aralez::process::daemonize_if_asked(&cli.conf.path, options) {
        Ok(ready) => ready,
        Err(e) => {
            eprintln!("aralez: {e}");
            return ExitCode::FAILURE;
        }
    };
    match aralez::process::run(&cli.conf.path, options, &mut ready) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aralez: {e}");
            if let Some(pipe) = ready.take() {
                pipe.failed(&e.to_string());
            }
            ExitCode::FAILURE
        }
    }
}
