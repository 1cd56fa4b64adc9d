//! The `aralez` command line: parses arguments and calls into the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Parser, Subcommand, ValueEnum};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A fast reverse proxy that reads Aralez's main.yaml and upstreams.yaml.
#[derive(Parser, Debug)]
#[command(
    name = "aralez",
    version,
    disable_version_flag = true,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Path of main.yaml.
    #[arg(
        short = 'c',
        long = "conf",
        value_name = "FILE",
        default_value = "/etc/aralez/main.yaml"
    )]
    conf: PathBuf,
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

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate main.yaml, the upstreams file and conf.d; print every error and warning.
    CheckConfig {
        /// Path of main.yaml.
        #[arg(
            short = 'c',
            long = "conf",
            value_name = "FILE",
            default_value = "/etc/aralez/main.yaml"
        )]
        conf: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Exit 1 on warnings too.
        #[arg(long)]
        deny_warnings: bool,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Text,
    Json,
}

fn check(conf: &std::path::Path, format: Format, deny_warnings: bool) -> ExitCode {
    let report = aralez::check::check(conf);
    match format {
        Format::Text => print!("{}", aralez::check::render_text(&report)),
        Format::Json => println!("{}", aralez::check::render_json(&report)),
    }
    if aralez::check::failed(&report, deny_warnings) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::CheckConfig {
        conf,
        format,
        deny_warnings,
    }) = &cli.command
    {
        return check(conf, *format, *deny_warnings);
    }
    if cli.test {
        return check(&cli.conf, Format::Text, false);
    }
    let options = aralez::process::RunOptions {
        daemon: cli.daemon,
        upgrade: cli.upgrade,
    };
    // Fork (when asked) before anything starts a thread.
    let mut ready = match aralez::process::daemonize_if_asked(&cli.conf, options) {
        Ok(ready) => ready,
        Err(e) => {
            eprintln!("aralez: {e}");
            return ExitCode::FAILURE;
        }
    };
    match aralez::process::run(&cli.conf, options, &mut ready) {
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
