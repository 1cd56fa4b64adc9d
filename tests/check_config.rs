//! A corpus of broken (and a few valid) config files run through the real binary:
//! `aralez check-config --format json` must name file, line, key and reason for every problem,
//! `aralez -t` must agree, and `aralez -c` must refuse to start on a broken config without panicking.

use crate::support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_aralez");

/// A main.yaml that is fine, pointing at `upstreams.yaml` beside it. Port 0: a proxy that wrongly
/// starts on a broken upstreams file must not collide with anything.
const MAIN_OK: &str = "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n";

/// An upstreams.yaml that is fine (v0.92 shape).
const UPS_OK: &str = "\
upstreams:
  example.com:
    paths:
      \"/\":
        servers: [\"127.0.0.1:8000\"]
";

/// Start of a v0.92 file whose path `/` of `a.com` is open at line 4; append its keys at 8 spaces.
const PATH_HEAD: &str = "\
upstreams:
  a.com:
    paths:
      \"/\":
";

const KEY_ROOT: &str = "upstreams.a.com.paths./";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sev {
    Error,
    Warning,
}

impl Sev {
    fn as_str(self) -> &'static str {
        match self {
            Sev::Error => "error",
            Sev::Warning => "warning",
        }
    }
}

/// One issue the report must contain.
#[derive(Clone, Debug)]
struct Expect {
    file: &'static str,
    line: u64,
    key: String,
    msgs: Vec<&'static str>,
    sev: Sev,
}

impl Expect {
    /// Another substring the message must contain.
    fn also(mut self, msg: &'static str) -> Self {
        self.msgs.push(msg);
        self
    }
}

fn err(file: &'static str, line: u64, key: impl Into<String>, msg: &'static str) -> Expect {
    Expect {
        file,
        line,
        key: key.into(),
        msgs: vec![msg],
        sev: Sev::Error,
    }
}

fn warn(file: &'static str, line: u64, key: impl Into<String>, msg: &'static str) -> Expect {
    Expect {
        sev: Sev::Warning,
        ..err(file, line, key, msg)
    }
}

/// `upstreams.a.com.paths./.<rest>`
fn pk(rest: &str) -> String {
    format!("{KEY_ROOT}.{rest}")
}

struct Case {
    name: &'static str,
    main: Vec<u8>,
    /// `None`: no upstreams.yaml is written.
    upstreams: Option<Vec<u8>>,
    conf_d: Vec<(&'static str, Vec<u8>)>,
    exit: i32,
    issues: Vec<Expect>,
}

impl Case {
    fn broken(name: &'static str, main: &str, upstreams: &str, issues: Vec<Expect>) -> Case {
        Case {
            name,
            main: main.as_bytes().to_vec(),
            upstreams: Some(upstreams.as_bytes().to_vec()),
            conf_d: Vec::new(),
            exit: 1,
            issues,
        }
    }

    /// A v0.92 file where `/` of `a.com` has these keys (each line indented by 8 spaces).
    fn path(name: &'static str, body: &str, issues: Vec<Expect>) -> Case {
        Case::broken(name, MAIN_OK, &format!("{PATH_HEAD}{body}"), issues)
    }

    /// A broken main.yaml beside a valid upstreams.yaml.
    fn main(name: &'static str, main: &str, issues: Vec<Expect>) -> Case {
        Case::broken(name, main, UPS_OK, issues)
    }

    fn warnings_only(mut self) -> Case {
        self.exit = 0;
        self
    }

    fn with_conf_d(mut self, file: &'static str, text: &str) -> Case {
        self.conf_d.push((file, text.as_bytes().to_vec()));
        self
    }

    fn with_upstreams_bytes(mut self, bytes: Vec<u8>) -> Case {
        self.upstreams = Some(bytes);
        self
    }

    fn without_upstreams(mut self) -> Case {
        self.upstreams = None;
        self
    }

    /// Writes the files into a fresh directory; returns it and the main.yaml path.
    fn write(&self) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let main = dir.path().join("main.yaml");
        std::fs::write(&main, &self.main).unwrap();
        if let Some(ups) = &self.upstreams {
            std::fs::write(dir.path().join("upstreams.yaml"), ups).unwrap();
        }
        if !self.conf_d.is_empty() {
            let conf_d = dir.path().join("conf.d");
            std::fs::create_dir(&conf_d).unwrap();
            for (name, text) in &self.conf_d {
                std::fs::write(conf_d.join(name), text).unwrap();
            }
        }
        (dir, main)
    }
}

fn alias_bomb() -> String {
    let lol = ["\"lol\""; 9].join(",");
    let mut doc = format!("a: &a [{lol}]\n");
    let mut prev = 'a';
    for name in 'b'..='j' {
        let refs = vec![format!("*{prev}"); 9].join(",");
        doc.push_str(&format!("{name}: &{name} [{refs}]\n"));
        prev = name;
    }
    doc
}

fn fifty_megabytes() -> Vec<u8> {
    let line = b"# padding padding padding padding padding padding padding padding padding\n";
    let mut out = Vec::with_capacity(50 * 1024 * 1024 + line.len());
    out.extend_from_slice(UPS_OK.as_bytes());
    while out.len() < 50 * 1024 * 1024 {
        out.extend_from_slice(line);
    }
    out
}

fn cases() -> Vec<Case> {
    const U: &str = "upstreams.yaml";
    const M: &str = "main.yaml";
    vec![
        // ---- YAML syntax ----
        Case::broken(
            "yaml_unclosed_flow_sequence",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"\n",
            vec![err(U, 4, "(yaml)", "invalid YAML").also("unclosed")],
        ),
        Case::path(
            "yaml_bad_indentation",
            "        servers: [\"127.0.0.1:8000\"]\n     rate_limit: 3\n",
            vec![err(U, 6, "(yaml)", "invalid YAML")],
        ),
        Case::broken(
            "yaml_tab_indentation",
            MAIN_OK,
            "upstreams:\n  a.com:\n\tpaths:\n      \"/\":\n        servers: [\"127.0.0.1:8000\"]\n",
            vec![err(U, 3, "(yaml)", "invalid YAML").also("tab")],
        ),
        Case::main(
            "yaml_syntax_in_main",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: [upstreams.yaml\nthreads: 2\n",
            vec![err(M, 3, "(yaml)", "invalid YAML").also("the `[` on line 2 closed?")],
        ),
        Case::path(
            "yaml_duplicate_key_in_upstreams",
            "        servers: [\"127.0.0.1:8000\"]\n        rate_limit: 5\n        rate_limit: 6\n",
            vec![err(U, 7, "(yaml)", "duplicate key `rate_limit`")],
        ),
        Case::main(
            "yaml_duplicate_key_in_main",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nproxy_address_http: \"127.0.0.1:1\"\n",
            vec![err(M, 3, "(yaml)", "duplicate key `proxy_address_http`")],
        ),
        Case::broken(
            "yaml_two_documents",
            MAIN_OK,
            &format!("{UPS_OK}---\nb.com: {{}}\n"),
            vec![err(U, 6, "(yaml)", "more than one YAML document")],
        ),
        // ---- acme: (DNS-01 and its provider) ----
        Case::main(
            "acme_dns_01_without_a_provider",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  challenge: dns-01\n  domains: [a.test]\n"),
            vec![err(M, 5, "acme.challenge", "set it").also("acme_dns_provider")],
        ),
        Case::main(
            "acme_wildcard_needs_dns_01",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  domains: [\"*.a.test\"]\n"),
            vec![err(M, 5, "acme.domains", "only be validated by dns-01")],
        ),
        Case::main(
            "acme_unknown_dns_provider",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  domains: [a.test]\nacme_dns_provider: godaddy\n"),
            vec![err(M, 6, "acme_dns_provider", "not cloudflare, route53 or digitalocean")],
        ),
        Case::main(
            "acme_provider_without_its_environment",
            &format!("{MAIN_OK}proxy_certificates: \".\"\nacme:\n  domains: [\"*.a.test\"]\nacme_dns_provider: route53\n"),
            vec![warn(M, 6, "acme_dns_provider", "AWS_ACCESS_KEY_ID").also("not set")],
        )
        .warnings_only(),
        Case::path(
            "acme_on_a_path",
            "        servers: [\"127.0.0.1:8000\"]\n        acme: true\n",
            vec![warn(U, 6, pk("acme"), "applies to a host")],
        )
        .warnings_only(),
        Case::main(
            "http3_without_a_tls_listener",
            &format!("{MAIN_OK}http3: true\n"),
            vec![err(M, 3, "http3", "proxy_address_tls")],
        ),
        Case::main(
            "tls_listener_without_certificates",
            &format!("{MAIN_OK}proxy_address_tls: \"127.0.0.1:0\"\n"),
            vec![err(M, 3, "proxy_address_tls", "needs a certificate directory")],
        ),
        Case::main(
            "admin_api_on_the_proxy_port",
            "proxy_address_http: \"127.0.0.1:16193\"\nupstreams_conf: upstreams.yaml\nconfig_address: \"127.0.0.1:16193\"\n",
            vec![err(M, 3, "config_address", "is also `proxy_address_http`'s (line 1)")],
        ),
        Case::main(
            "tls_listener_on_the_plain_port_of_every_address",
            "proxy_address_http: \"0.0.0.0:16193\"\nupstreams_conf: upstreams.yaml\nproxy_certificates: \".\"\nproxy_address_tls: \"127.0.0.1:16193\"\nfile_server_address: \"127.0.0.1:16193\"\n",
            vec![
                err(M, 4, "proxy_address_tls", "is also `proxy_address_http`'s (line 1)"),
                err(M, 5, "file_server_address", "is also `proxy_address_http`'s (line 1)"),
                warn(M, 5, "file_server_address", "nothing is served without file_server_folder"),
            ],
        ),
        Case::main(
            "admin_tls_listener_without_its_certificate",
            &format!("{MAIN_OK}config_tls_address: \"127.0.0.1:0\"\nconfig_tls_key_file: \"main.yaml\"\n"),
            vec![err(M, 3, "config_tls_address", "needs config_tls_certificate and config_tls_key_file")],
        ),
        Case::main(
            "admin_certificate_and_key_are_not_pem",
            &format!("{MAIN_OK}config_tls_address: \"127.0.0.1:0\"\nconfig_tls_certificate: \"upstreams.yaml\"\nconfig_tls_key_file: \"main.yaml\"\n"),
            vec![
                err(M, 4, "config_tls_certificate", "upstreams.yaml` holds no PEM certificate"),
                err(M, 5, "config_tls_key_file", "main.yaml` holds no PEM private key"),
            ],
        ),
        Case::main(
            "file_server_address_without_a_folder",
            &format!("{MAIN_OK}file_server_address: \"127.0.0.1:0\"\n"),
            vec![warn(M, 3, "file_server_address", "nothing is served without file_server_folder")],
        )
        .warnings_only(),
        Case::main(
            "file_server_folder_and_admin_certificate_without_their_listeners",
            &format!("{MAIN_OK}file_server_folder: \".\"\nconfig_tls_certificate: \"main.yaml\"\n"),
            vec![
                warn(M, 3, "file_server_folder", "not served without file_server_address"),
                warn(M, 4, "config_tls_certificate", "not used without config_tls_address"),
            ],
        )
        .warnings_only(),
        Case::main(
            "log_file_in_a_missing_directory",
            &format!("{MAIN_OK}log_file: \"no-such-dir/aralez.log, 10, 3, false\"\n"),
            vec![err(M, 3, "log_file", "its directory").also("no-such-dir` does not exist")],
        ),
        Case::main(
            "error_log_in_a_missing_directory",
            &format!("{MAIN_OK}error_log: \"no-such-dir/error.log\"\n"),
            vec![err(M, 3, "error_log", "cannot be created")],
        ),
        Case::main(
            "access_log_file_in_a_missing_directory",
            &format!("{MAIN_OK}access_log: all\naccess_log_file: \"no-such-dir/access.log\"\n"),
            vec![err(M, 4, "access_log_file", "cannot be created")],
        ),
        // Not opened while the access log is off: a warning that it is unused, not an error.
        Case::main(
            "access_log_file_while_the_access_log_is_off",
            &format!("{MAIN_OK}access_log_file: \"no-such-dir/access.log\"\n"),
            vec![warn(M, 3, "access_log_file", "not written while access_log is off")],
        )
        .warnings_only(),
        Case::main(
            "pid_file_is_a_directory",
            &format!("{MAIN_OK}pid_file: \"/tmp\"\n"),
            vec![err(M, 3, "pid_file", "is a directory, not a file")],
        ),
        // ---- wrong types ----
        Case::path(
            "type_string_for_number",
            "        servers: [\"127.0.0.1:8000\"]\n        rate_limit: \"ten\"\n",
            vec![err(U, 6, pk("rate_limit"), "expected a whole number, found a string `ten`")],
        ),
        Case::broken(
            "type_list_for_map",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths: [\"/\", \"/api\"]\n",
            vec![err(U, 3, "upstreams.a.com.paths", "expected a mapping, found a list")],
        ),
        Case::path(
            "type_map_for_list",
            "        servers:\n          primary: \"127.0.0.1:8000\"\n",
            vec![err(U, 6, pk("servers"), "expected a list of strings, found a mapping")],
        ),
        Case::main(
            "type_string_for_number_in_main",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nthreads: many\n",
            vec![err(M, 3, "threads", "expected a whole number, found a string `many`")],
        ),
        Case::path(
            "type_bad_boolean",
            "        servers: [\"127.0.0.1:8000\"]\n        to_https: maybe\n",
            vec![err(U, 6, pk("to_https"), "expected true or false, found a string `maybe`")],
        ),
        // ---- backend addresses ----
        Case::path(
            "server_without_port",
            "        servers: [\"127.0.0.1\"]\n",
            vec![err(U, 5, pk("servers[0]"), "`127.0.0.1` has no port")],
        ),
        Case::path(
            "server_port_zero",
            "        servers:\n          - \"127.0.0.1:8000\"\n          - \"127.0.0.1:0\"\n",
            vec![err(U, 7, pk("servers[1]"), "port 0 is not a valid port")],
        ),
        Case::path(
            "server_port_out_of_range",
            "        servers: [\"127.0.0.1:70000\"]\n",
            vec![err(U, 5, pk("servers[0]"), "port 70000 is out of range")],
        ),
        Case::path(
            "server_port_not_numeric",
            "        servers: [\"backend.local:http\"]\n",
            vec![err(U, 5, pk("servers[0]"), "port `http` is not a number")],
        ),
        Case::path(
            "server_ipv6_without_brackets",
            "        servers: [\"::1:8080\"]\n",
            vec![err(U, 5, pk("servers[0]"), "brackets").also("[::1]:8080")],
        ),
        Case::path(
            "server_bad_scheme",
            "        servers: [\"ftp://127.0.0.1:21\"]\n",
            vec![err(U, 5, pk("servers[0]"), "unknown scheme `ftp://`")],
        ),
        Case::path(
            "server_no_host",
            "        servers: [\":8000\"]\n",
            vec![err(U, 5, pk("servers[0]"), "`:8000` has no host")],
        ),
        Case::path(
            "server_with_path",
            "        servers: [\"127.0.0.1:8000/api\"]\n",
            vec![err(U, 5, pk("servers[0]"), "without a path")],
        ),
        // ---- listen addresses in main.yaml ----
        Case::main(
            "listen_without_port",
            "proxy_address_http: \"0.0.0.0\"\nupstreams_conf: upstreams.yaml\n",
            vec![err(M, 1, "proxy_address_http", "`0.0.0.0` has no port")],
        ),
        Case::main(
            "listen_host_name",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nconfig_address: \"localhost:8080\"\n",
            vec![err(M, 3, "config_address", "IP literal").also("`localhost`")],
        ),
        Case::main(
            "listen_port_out_of_range",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nproxy_address_tls: \"0.0.0.0:99999\"\n",
            vec![err(M, 3, "proxy_address_tls", "port 99999 is out of range")],
        ),
        Case::main(
            "listen_ipv6_without_brackets",
            "proxy_address_http: \"::1:6193\"\nupstreams_conf: upstreams.yaml\n",
            vec![err(M, 1, "proxy_address_http", "brackets").also("[::1]:6193")],
        ),
        // ---- headers ----
        Case::path(
            "header_without_colon",
            "        servers: [\"127.0.0.1:8000\"]\n        server_headers: [\"X-From aralez\"]\n",
            vec![err(U, 6, pk("server_headers[0]"), "`X-From aralez` has no `:`")],
        ),
        // ---- compress ----
        Case::path(
            "compress_not_a_boolean",
            "        servers: [\"127.0.0.1:8000\"]\n        compress: gzip\n",
            vec![err(U, 6, pk("compress"), "expected true, false or a mapping of min_size and types")],
        ),
        Case::path(
            "compress_negative_min_size",
            "        servers: [\"127.0.0.1:8000\"]\n        compress: {min_size: -5}\n",
            vec![err(U, 6, pk("compress.min_size"), "must not be negative")],
        ),
        Case::path(
            "compress_bad_media_type",
            "        servers: [\"127.0.0.1:8000\"]\n        compress:\n          types: [\"text/html\", \"text/html; charset=utf-8\"]\n",
            vec![err(U, 7, pk("compress.types[1]"), "is not a media type").also("no parameters")],
        ),
        Case::path(
            "compress_empty_types",
            "        servers: [\"127.0.0.1:8000\"]\n        compress: {types: []}\n",
            vec![err(U, 6, pk("compress.types"), "the list of types is empty")],
        ),
        Case::path(
            "compress_unknown_key",
            "        servers: [\"127.0.0.1:8000\"]\n        compress: {min_size: 10, level: 9}\n",
            vec![warn(U, 6, pk("compress.level"), "unknown key `level`")],
        )
        .warnings_only(),
        Case::path(
            "header_name_with_space",
            "        servers: [\"127.0.0.1:8000\"]\n        client_headers:\n          - \"X-Ok: 1\"\n          - \"Bad Name: x\"\n",
            vec![err(U, 8, pk("client_headers[1]"), "`Bad Name` is not a valid header name")
                .also("space")],
        ),
        Case::path(
            "header_value_control_char",
            "        servers: [\"127.0.0.1:8000\"]\n        client_headers: [\"X-A: a\\x01b\"]\n",
            vec![err(U, 6, pk("client_headers[0]"), "value of `X-A` contains a control character")],
        ),
        // ---- unknown keys (warnings) ----
        Case::main(
            "unknown_key_in_main",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nthreds: 4\n",
            vec![warn(M, 3, "threds", "unknown key `threds`, did you mean `threads`?")],
        )
        .warnings_only(),
        Case::broken(
            "unknown_key_at_host_level",
            MAIN_OK,
            "upstreams:\n  a.com:\n    rate_limt: 10\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n",
            vec![warn(U, 3, "upstreams.a.com.rate_limt", "did you mean `rate_limit`?")],
        )
        .warnings_only(),
        Case::path(
            "unknown_key_at_path_level",
            "        servers: [\"127.0.0.1:8000\"]\n        rate_limt: 10\n",
            vec![warn(U, 6, pk("rate_limt"), "unknown key `rate_limt`, did you mean `rate_limit`?")],
        )
        .warnings_only(),
        // ---- authorization ----
        Case::path(
            "auth_unknown_type",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: jwk\n          data: secret\n",
            vec![err(U, 7, pk("authorization.type"), "unknown auth type `jwk`, did you mean `jwt`?")],
        ),
        Case::path(
            "auth_basic_without_data",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization: {type: basic}\n",
            vec![err(U, 6, pk("authorization"), "auth type `basic` needs `data`")],
        ),
        Case::path(
            "auth_apikey_without_data",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: apikey\n",
            vec![err(U, 7, pk("authorization"), "auth type `apikey` needs `data`")],
        ),
        Case::path(
            "auth_forward_without_data",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: forward\n          data: \"\"\n",
            vec![err(U, 7, pk("authorization"), "auth type `forward` needs `data`")],
        ),
        Case::path(
            "auth_forward_not_a_url",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: forward\n          data: auth.local/check\n",
            vec![err(U, 8, pk("authorization.data"), "`auth.local/check` is not an http:// or https:// URL")],
        ),
        Case::path(
            "auth_basic_data_without_colon",
            "        servers: [\"127.0.0.1:8000\"]\n        authorization:\n          type: basic\n          data: justauser\n",
            vec![err(U, 8, pk("authorization.data"), "must be `user:password`")],
        ),
        // ---- limits and values ----
        Case::main(
            "hc_interval_zero",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nhc_interval: 0\n",
            vec![err(M, 3, "hc_interval", "must be between 1 and 3600 (found 0)")],
        ),
        Case::path(
            "negative_rate_limit",
            "        servers: [\"127.0.0.1:8000\"]\n        rate_limit: -5\n",
            vec![err(U, 6, pk("rate_limit"), "must not be negative (found -5)")],
        ),
        Case::path(
            "bad_sticky_sessions",
            "        servers: [\"127.0.0.1:8000\"]\n        sticky_sessions: sometimes\n",
            vec![err(U, 6, pk("sticky_sessions"), "true, false or a number of seconds")],
        ),
        Case::path(
            "redirect_not_absolute",
            "        redirect_to: \"www.example.com\"\n",
            vec![err(U, 5, pk("redirect_to"), "must be an absolute URL")],
        ),
        // ---- structure ----
        Case::path(
            "empty_servers_list",
            "        rate_limit: 5\n        servers: []\n",
            vec![err(U, 6, pk("servers"), "the list of servers is empty")],
        ),
        Case::broken(
            "path_without_leading_slash",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n      api:\n        servers: [\"127.0.0.1:8001\"]\n",
            vec![err(U, 5, "upstreams.a.com.paths.api", "path `api` must start with `/`")],
        ),
        Case::broken(
            "path_without_servers",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n      \"/api\":\n        rate_limit: 5\n",
            vec![err(U, 5, "upstreams.a.com.paths./api", "path `/api` has no `servers`")],
        ),
        Case::broken(
            "host_without_paths",
            MAIN_OK,
            "upstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n  b.com:\n    rate_limit: 5\n",
            vec![err(U, 5, "upstreams.b.com", "host `b.com` has no `paths`")],
        ),
        Case::broken(
            "duplicate_host_other_case",
            MAIN_OK,
            "upstreams:\n  example.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\n  Example.COM:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8001\"]}\n",
            vec![err(U, 5, "upstreams.Example.COM", "host `example.com` is defined twice (first on line 2)")],
        ),
        Case::broken(
            "both_shapes_mixed",
            MAIN_OK,
            "rate_limit: 100\nupstreams:\n  a.com:\n    paths:\n      \"/\": {servers: [\"127.0.0.1:8000\"]}\nb.com:\n  paths:\n    \"/\": {servers: [\"127.0.0.1:8001\"]}\n",
            vec![err(U, 6, "b.com", "under `upstreams:` (line 2)").also("`b.com`, line 6")],
        ),
        Case::broken(
            "document_not_a_mapping",
            MAIN_OK,
            "- \"127.0.0.1:8000\"\n- \"127.0.0.1:8001\"\n",
            vec![err(U, 1, "(document)", "expected a mapping, found a list")],
        ),
        Case::broken(
            "legacy_shape_errors",
            MAIN_OK,
            "sticky_sessions: maybe\nheaders: [\"X-A 1\"]\nauthorization: {type: basic, creds: nocolon}\nb.com:\n  paths:\n    \"/\": {servers: [\"127.0.0.1\"]}\n",
            vec![
                err(U, 1, "sticky_sessions", "found a string `maybe`"),
                err(U, 2, "headers[0]", "has no `:`"),
                err(U, 3, "authorization.creds", "must be `user:password`"),
                err(U, 6, "b.com.paths./.servers[0]", "has no port"),
            ],
        ),
        // ---- main.yaml structure ----
        Case::main(
            "main_missing_required_keys",
            "threads: 2\nlog_level: info\n",
            vec![
                err(M, 1, "proxy_address_http", "required key is missing"),
                err(M, 1, "upstreams_conf", "required key is missing"),
            ],
        ),
        Case::main(
            "upstreams_conf_missing_file",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: nowhere/upstreams.yaml\n",
            vec![err(M, 2, "upstreams_conf", "`nowhere/upstreams.yaml` does not exist")],
        )
        .without_upstreams(),
        Case::main(
            "upstreams_conf_is_a_directory",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: .\n",
            vec![err(M, 2, "upstreams_conf", "is a directory")],
        ),
        // ---- hostile files ----
        Case::broken(
            "alias_bomb",
            MAIN_OK,
            &alias_bomb(),
            vec![err(U, 6, "(yaml)", "alias bomb")],
        ),
        Case::broken(
            "fifty_megabytes",
            MAIN_OK,
            "",
            vec![err(U, 1, "(file)", "over the 8 MiB limit")],
        )
        .with_upstreams_bytes(fifty_megabytes()),
        Case::broken(
            "not_utf8",
            MAIN_OK,
            "",
            vec![err(U, 6, "(file)", "not valid UTF-8").also("0xe9")],
        )
        .with_upstreams_bytes(
            [UPS_OK.as_bytes(), b"# caf\xe9 au lait\n"].concat(),
        ),
        Case::main(
            "main_not_utf8",
            "",
            vec![err(M, 2, "(file)", "not valid UTF-8")],
        )
        .with_main_bytes(b"proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: \xff\xfe\n".to_vec()),
        // ---- conf.d ----
        Case::broken(
            "conf_d_file_with_error",
            MAIN_OK,
            UPS_OK,
            vec![err("conf.d/20-bad.yaml", 4, "b.com.paths./api.servers[1]", "port 99999 is out of range")],
        )
        .with_conf_d("10-good.yaml", "c.com:\n  paths:\n    \"/\": {servers: [\"127.0.0.1:8002\"]}\n")
        .with_conf_d(
            "20-bad.yaml",
            "b.com:\n  paths:\n    \"/api\":\n      servers: [\"127.0.0.1:8001\", \"127.0.0.1:99999\"]\n",
        ),
        Case::broken(
            "conf_d_file_bad_yaml",
            MAIN_OK,
            UPS_OK,
            vec![err("conf.d/b.yaml", 2, "(yaml)", "invalid YAML")],
        )
        .with_conf_d("b.yaml", "b.com:\n  paths: {\"/\": {servers: [\"127.0.0.1:8001\"]}\n"),
        // ---- many errors in one file ----
        Case::broken(
            "several_errors_in_one_file",
            MAIN_OK,
            "upstreams:
  a.com:
    paths:
      \"/\":
        servers:
          - \"127.0.0.1\"
          - \"127.0.0.1:8000\"
          - \"[::1]:99999\"
        rate_limit: -1
        client_headers: [\"NoColon\"]
        authorization: {type: jwk}
      api:
        servers: [\"127.0.0.1:8000\"]
  b.com:
    paths:
      \"/\": {servers: []}
",
            vec![
                err(U, 6, pk("servers[0]"), "has no port"),
                err(U, 8, pk("servers[2]"), "port 99999 is out of range"),
                err(U, 9, pk("rate_limit"), "must not be negative"),
                err(U, 10, pk("client_headers[0]"), "has no `:`"),
                err(U, 11, pk("authorization.type"), "did you mean `jwt`?"),
                err(U, 12, "upstreams.a.com.paths.api", "must start with `/`"),
                err(U, 16, "upstreams.b.com.paths./.servers", "the list of servers is empty"),
            ],
        ),
        Case::main(
            "several_errors_in_main",
            "proxy_address_http: \"0.0.0.0\"\nupstreams_conf: upstreams.yaml\nthreads: 0\nlog_level: loud\ndaemon: [yes]\nthreds: 3\n",
            vec![
                err(M, 1, "proxy_address_http", "has no port"),
                err(M, 3, "threads", "must be between 1 and 1024 (found 0)"),
                err(M, 4, "log_level", "`loud` is not one of"),
                err(M, 5, "daemon", "expected true or false, found a list"),
                warn(M, 6, "threds", "did you mean `threads`?"),
            ],
        ),
        Case::main(
            "log_keys_bad",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n\
             log_file: \"a.log, 0, 3, true\"\nlog_pattern: \"{d} {q}\"\n\
             access_log_file: \"b.log, 10, 2, maybe\"\naccess_log_format: xml\n",
            vec![
                err(M, 3, "log_file", "max MB `0` is not a whole number from 1"),
                err(M, 4, "log_pattern", "`{q}` is not a known piece"),
                err(M, 5, "access_log_file", "compress `maybe` is not true or false"),
                err(M, 6, "access_log_format", "`xml` is not one of: logfmt, json"),
            ],
        ),
        // ---- what main.yaml names must exist (as nginx -t opens its files) ----
        Case::main(
            "named_files_and_accounts_missing",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n\
             proxy_address_tls: \"127.0.0.1:0\"\nproxy_certificates: no-certs\n\
             config_tls_certificate: no.crt\nconfig_tls_key_file: no.key\n\
             file_server_folder: no-www\nfile_server_address: \"127.0.0.1:0\"\n\
             ca_file: no-ca.pem\nrunuser: no-such-user-aralez\nrungroup: no-such-group-aralez\n\
             config_tls_address: \"127.0.0.1:0\"\n",
            vec![
                err(M, 4, "proxy_certificates", "`").also("no-certs` does not exist"),
                err(M, 5, "config_tls_certificate", "no.crt` does not exist"),
                err(M, 6, "config_tls_key_file", "no.key` does not exist"),
                err(M, 7, "file_server_folder", "no-www` does not exist"),
                err(M, 9, "ca_file", "no-ca.pem` does not exist"),
                err(M, 10, "runuser", "no user `no-such-user-aralez` on this system"),
                err(M, 11, "rungroup", "no group `no-such-group-aralez` on this system"),
            ],
        ),
        Case::main(
            "pingora_user_names_no_account",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nuser: no-such-user-aralez\n",
            vec![err(M, 3, "user", "no user `no-such-user-aralez` on this system")],
        ),
        Case::main(
            "file_server_folder_is_a_file",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\n\
             file_server_folder: upstreams.yaml\nfile_server_address: \"127.0.0.1:0\"\n",
            vec![err(M, 3, "file_server_folder", "upstreams.yaml` is not a directory")],
        ),
        // ---- one file's errors do not hide the other's ----
        Case::broken(
            "errors_in_both_files_are_all_reported",
            "proxy_address_http: \"127.0.0.1:0\"\nupstreams_conf: upstreams.yaml\nthreads: many\n",
            &format!("{PATH_HEAD}        servers: [\"127.0.0.1:8000\"]\n        rate_limit: \"ten\"\n"),
            vec![
                err(M, 3, "threads", "expected a whole number"),
                err(U, 6, pk("rate_limit"), "expected a whole number, found a string `ten`"),
            ],
        ),
    ]
}

impl Case {
    fn with_main_bytes(mut self, bytes: Vec<u8>) -> Case {
        self.main = bytes;
        self
    }
}

/// What a finished (or killed) child left.
struct Outcome {
    /// `None`: killed after the timeout, or ended by a signal.
    code: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

fn run(args: &[&std::ffi::OsStr], timeout: Duration) -> Outcome {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn aralez");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let mut exited = None;
    support::eventually_blocking(timeout, || {
        exited = child.try_wait().expect("wait");
        exited.is_some()
    });
    let timed_out = exited.is_none();
    let status = exited.unwrap_or_else(|| {
        let _ = child.kill();
        child.wait().expect("wait after kill")
    });
    let elapsed = started.elapsed();
    Outcome {
        code: if timed_out { None } else { status.code() },
        timed_out,
        stdout: String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned(),
        elapsed,
    }
}

fn check_config(main: &Path, extra: &[&str]) -> Outcome {
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["check-config".as_ref(), "-c".as_ref(), main.as_os_str()];
    args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
    run(&args, Duration::from_secs(30))
}

fn check_json(main: &Path) -> (Outcome, Value) {
    let out = check_config(main, &["--format", "json"]);
    let json: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check-config printed no JSON ({e}):\nstdout: {}\nstderr: {}",
            out.stdout, out.stderr
        )
    });
    (out, json)
}

fn describe(issues: &[Value]) -> String {
    issues
        .iter()
        .map(|i| {
            format!(
                "  {}:{}:{}: {}: `{}`: {}",
                i["file"].as_str().unwrap_or("?"),
                i["line"],
                i["column"],
                i["severity"].as_str().unwrap_or("?"),
                i["key"].as_str().unwrap_or("?"),
                i["message"].as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn matches(issue: &Value, want: &Expect) -> bool {
    issue["severity"] == want.sev.as_str()
        && issue["file"]
            .as_str()
            .is_some_and(|f| f.ends_with(&format!("/{}", want.file)))
        && issue["line"].as_u64() == Some(want.line)
        && issue["key"].as_str() == Some(want.key.as_str())
        && issue["message"]
            .as_str()
            .is_some_and(|m| want.msgs.iter().all(|s| m.contains(s)))
}

#[test]
fn corpus_reports_file_line_key_and_reason() {
    let cases = cases();
    let broken = cases.iter().filter(|c| c.exit == 1).count();
    assert!(broken >= 32, "only {broken} broken cases");
    let mut failures = Vec::new();
    for case in &cases {
        let (_dir, main) = case.write();
        let (out, json) = check_json(&main);
        let issues = json["issues"].as_array().cloned().unwrap_or_default();
        let mut problems = Vec::new();
        if out.code != Some(case.exit) {
            problems.push(format!("exit {:?}, expected {}", out.code, case.exit));
        }
        if out.stderr.contains("panicked") {
            problems.push(format!("panicked: {}", out.stderr));
        }
        let want_errors = case.issues.iter().filter(|e| e.sev == Sev::Error).count();
        let want_warnings = case.issues.len() - want_errors;
        if json["errors"].as_u64() != Some(want_errors as u64)
            || json["warnings"].as_u64() != Some(want_warnings as u64)
        {
            problems.push(format!(
                "{} error(s) and {} warning(s), expected {want_errors} and {want_warnings}",
                json["errors"], json["warnings"]
            ));
        }
        if json["ok"] != (want_errors == 0) {
            problems.push(format!("\"ok\" is {}", json["ok"]));
        }
        for want in &case.issues {
            if !issues.iter().any(|i| matches(i, want)) {
                problems.push(format!(
                    "missing {} at {}:{} `{}` containing {:?}",
                    want.sev.as_str(),
                    want.file,
                    want.line,
                    want.key,
                    want.msgs
                ));
            }
        }
        for issue in &issues {
            let line = issue["line"].as_u64().unwrap_or(0);
            let column = issue["column"].as_u64().unwrap_or(0);
            if line == 0 || column == 0 {
                problems.push(format!("issue without a position: {issue}"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!(
                "[{}]\n  {}\n reported:\n{}",
                case.name,
                problems.join("\n  "),
                describe(&issues)
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn several_errors_in_one_file_are_reported_together() {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "several_errors_in_one_file")
        .unwrap();
    let (_dir, main) = case.write();
    let (out, json) = check_json(&main);
    assert_eq!(out.code, Some(1));
    let issues = json["issues"].as_array().unwrap();
    assert!(issues.len() >= 3, "{}", describe(issues));
    let mut lines: Vec<u64> = issues.iter().filter_map(|i| i["line"].as_u64()).collect();
    lines.sort_unstable();
    assert_eq!(lines, vec![6, 8, 9, 10, 11, 12, 16], "{}", describe(issues));
}

#[test]
fn hostile_files_are_refused_quickly() {
    for name in ["alias_bomb", "fifty_megabytes"] {
        let case = cases().into_iter().find(|c| c.name == name).unwrap();
        let (_dir, main) = case.write();
        let (out, json) = check_json(&main);
        assert_eq!(out.code, Some(1), "{name}");
        assert_eq!(json["errors"], 1, "{name}");
        assert!(
            out.elapsed < Duration::from_millis(1500),
            "{name}: check-config took {:?}",
            out.elapsed
        );
    }
}

#[test]
fn broken_configs_never_panic_and_the_proxy_refuses_to_start() {
    let mut failures = Vec::new();
    for case in cases().iter().filter(|c| c.exit == 1) {
        let (_dir, main) = case.write();
        for format in ["text", "json"] {
            let out = check_config(&main, &["--format", format]);
            if out.code != Some(1) || out.stderr.contains("panicked") {
                failures.push(format!(
                    "[{}] check-config --format {format}: exit {:?}\n{}",
                    case.name, out.code, out.stderr
                ));
            }
        }
        let t = run(
            &["-t".as_ref(), "-c".as_ref(), main.as_os_str()],
            Duration::from_secs(30),
        );
        if t.code != Some(1) || t.stderr.contains("panicked") {
            failures.push(format!(
                "[{}] -t: exit {:?}\n{}",
                case.name, t.code, t.stderr
            ));
        }
        let proxy = run(&["-c".as_ref(), main.as_os_str()], Duration::from_secs(10));
        if proxy.timed_out {
            failures.push(format!(
                "[{}] the proxy started on a broken config (killed after {:?})",
                case.name, proxy.elapsed
            ));
            continue;
        }
        if proxy.code != Some(1) || proxy.stderr.contains("panicked") {
            failures.push(format!(
                "[{}] proxy: exit {:?} (expected 1)\n{}",
                case.name, proxy.code, proxy.stderr
            ));
            continue;
        }
        for want in case.issues.iter().filter(|e| e.sev == Sev::Error) {
            let place = format!("{}:{}:", want.file, want.line);
            if !proxy.stderr.contains(&place) || !proxy.stderr.contains("error:") {
                failures.push(format!(
                    "[{}] proxy stderr does not name {place}:\n{}",
                    case.name, proxy.stderr
                ));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn warnings_pass_unless_denied() {
    for case in cases().iter().filter(|c| c.exit == 0) {
        let (_dir, main) = case.write();
        let out = check_config(&main, &["--format", "json"]);
        assert_eq!(out.code, Some(0), "[{}] {}", case.name, out.stdout);
        let out = check_config(&main, &["--format", "json", "--deny-warnings"]);
        assert_eq!(
            out.code,
            Some(1),
            "[{}] --deny-warnings: {}",
            case.name,
            out.stdout
        );
        let t = run(
            &["-t".as_ref(), "-c".as_ref(), main.as_os_str()],
            Duration::from_secs(30),
        );
        assert_eq!(t.code, Some(0), "[{}] -t: {}", case.name, t.stdout);
    }
}

/// Writes a valid config (with optional conf.d files) and checks it: 0 errors, 0 warnings.
fn assert_valid(upstreams: &str, conf_d: &[(&'static str, &str)], shape: Value) -> Value {
    let mut case = Case::broken("valid", MAIN_OK, upstreams, Vec::new());
    for (name, text) in conf_d {
        case = case.with_conf_d(name, text);
    }
    let (_dir, main) = case.write();
    let (out, json) = check_json(&main);
    let issues = json["issues"].as_array().cloned().unwrap_or_default();
    assert_eq!(out.code, Some(0), "{}", describe(&issues));
    assert_eq!(json["ok"], true);
    assert_eq!(json["errors"], 0, "{}", describe(&issues));
    assert_eq!(json["warnings"], 0, "{}", describe(&issues));
    assert_eq!(json["shape"], shape);
    json
}

#[test]
fn current_shape_loads_cleanly() {
    let ups = r#"
provider: file
sticky_sessions: 3600
to_https: false
rate_limit: 1000
server_headers: ["X-Proxy:aralez"]
client_headers: ["Server:aralez"]
upstreams:
  DEFAULT:
    paths:
      "/": { servers: ["127.0.0.1:9000"] }
  Example.com:
    rate_limit: 100
    paths:
      "/":
        servers: ["127.0.0.1:8000", "backend.local:8001", "[::1]:8002", "h2c://127.0.0.1:8003"]
        healthcheck: false
      "/api":
        servers: ["https://10.0.0.5:9443"]
        rate_limit: 20
        x4xx_limit: 10
        authorization: { type: jwt, data: "secret" }
        server_headers: ["X-From:aralez"]
        client_headers: ["X-Frame-Options:DENY"]
      "/login":
        servers: ["127.0.0.1:8000"]
        authorization: { type: forward, data: "http://auth.local/check" }
      "/old":
        redirect_to: "https://www.example.com"
"#;
    let json = assert_valid(
        ups,
        &[(
            "extra.yaml",
            "b.com:\n  paths:\n    \"/\": {servers: [\"127.0.0.1:8010\"]}\n",
        )],
        Value::from("upstreams"),
    );
    let files: Vec<&str> = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(files[2].ends_with("conf.d/extra.yaml"), "{files:?}");
}

#[test]
fn older_readme_shape_loads_cleanly() {
    let ups = r#"
provider: "file"
sticky_sessions: false
to_https: false
headers:
  - "Access-Control-Allow-Origin:*"
authorization:
  type: basic
  creds: "user:pass"
myip.mydomain.com:
  paths:
    "/":
      to_https: false
      headers: ["X-Some-Thing:Yaaaaaaaaaaaaaaa"]
      servers:
        - "127.0.0.1:8000"
        - "127.0.0.2:8000"
    "/foo":
      servers: ["127.0.0.4:8443"]
polo.mydomain.com:
  paths:
    "/":
      authorization: { type: apikey, creds: "5ecbf799" }
      servers: ["192.168.1.1:8000"]
"#;
    assert_valid(ups, &[], Value::from("top-level"));
}

#[test]
fn empty_upstreams_file_is_valid() {
    for text in ["", "\n\n", "# nothing configured yet\n"] {
        let case = Case::broken("empty", MAIN_OK, text, Vec::new());
        let (_dir, main) = case.write();
        let (out, json) = check_json(&main);
        assert_eq!(out.code, Some(0), "{text:?}: {}", out.stdout);
        assert_eq!(json["errors"], 0, "{text:?}");
        assert_eq!(json["warnings"], 0, "{text:?}");
    }
}

#[test]
fn dash_t_agrees_with_check_config() {
    let good = Case::broken("good", MAIN_OK, UPS_OK, Vec::new());
    let (_dir, main) = good.write();
    let out = run(
        &["-t".as_ref(), "-c".as_ref(), main.as_os_str()],
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("0 error(s), 0 warning(s)"),
        "{}",
        out.stdout
    );

    let bad = Case::path("bad", "        servers: [\"127.0.0.1:0\"]\n", Vec::new());
    let (_dir2, main) = bad.write();
    let out = run(
        &["-t".as_ref(), "-c".as_ref(), main.as_os_str()],
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(1), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("upstreams.yaml:5:"), "{}", out.stdout);
}

#[test]
fn text_format_names_file_line_and_column() {
    let case = Case::path(
        "text",
        "        servers: [\"127.0.0.1:70000\"]\n        rate_limt: 3\n",
        Vec::new(),
    );
    let (_dir, main) = case.write();
    let out = check_config(&main, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    let ups = main.with_file_name("upstreams.yaml");
    let error_line = format!(
        "{}:5:19: error: `upstreams.a.com.paths./.servers[0]`: `127.0.0.1:70000`: port 70000 is out of range",
        ups.display()
    );
    assert!(out.stdout.contains(&error_line), "{}", out.stdout);
    let warning_line = format!(
        "{}:6:9: warning: `upstreams.a.com.paths./.rate_limt`: unknown key `rate_limt`, did you mean `rate_limit`?",
        ups.display()
    );
    assert!(out.stdout.contains(&warning_line), "{}", out.stdout);
    let summary = out.stdout.lines().last().unwrap_or("");
    assert!(summary.starts_with("checked "), "{summary}");
    assert!(
        summary.contains("1 error(s), 1 warning(s); upstreams shape:"),
        "{summary}"
    );
}

/// Guards the start check above: on a valid config the proxy does start, and `run` sees it running.
#[test]
fn the_proxy_starts_on_a_valid_config() {
    let case = Case::broken("valid", MAIN_OK, UPS_OK, Vec::new());
    let (dir, main) = case.write();
    let d = dir.path().display();
    let text =
        format!("{MAIN_OK}pid_file: \"{d}/aralez.pid\"\nupgrade_sock: \"{d}/aralez.sock\"\n");
    std::fs::write(&main, text).unwrap();
    let out = run(&["-c".as_ref(), main.as_os_str()], Duration::from_secs(2));
    assert!(
        out.timed_out,
        "the proxy exited {:?} on a valid config:\n{}{}",
        out.code, out.stdout, out.stderr
    );
}
