//! `aralez check-config` and `-t`: validate everything a start would read and report every issue.

use std::path::Path;
use std::sync::Arc;

use crate::config::yaml::Pos;
use crate::config::{self, Issue, Issues, MainConfig, Severity, Shape};

/// The outcome of a full validation.
pub struct Report {
    pub issues: Issues,
    pub shape: Option<Shape>,
    pub files: Vec<String>,
}

impl Report {
    pub fn error_count(&self) -> usize {
        self.issues.errors().count()
    }

    pub fn warning_count(&self) -> usize {
        self.issues.warnings().count()
    }
}

/// Reads main.yaml, the upstreams file and conf.d, collecting every issue.
pub fn check(main_path: &Path) -> Report {
    let mut issues = Issues::default();
    let mut files = vec![main_path.display().to_string()];
    let mut shape = None;
    // Every file's issues at once: a broken main.yaml still says where upstreams.yaml is.
    let loaded = config::load_main_as_far_as_valid(main_path, &mut issues);
    match &loaded {
        Some((main, true)) => check_certificates(main, main_path, &mut issues),
        // The certificate folder's pairs too (an error elsewhere in main.yaml hid a broken
        // pair until it was mended); a missing folder or admin pair is said already.
        Some((main, false)) if main.certificates_dir.as_deref().is_some_and(Path::is_dir) => {
            let mains = MainText::read(main_path);
            // A TLS listener written, valid or not (a bad port hid the folder too).
            let tls = written_at(&mains.text, "proxy_address_tls").is_some();
            check_certificate_folder(main, &mains, tls, &mut issues);
        }
        Some((_, false)) | None => {}
    }
    let main = loaded.and_then(|(main, valid)| valid.then_some(main));
    if let Some(main) = &main {
        issues.no_master_secret = !config::master_secret_set(main);
    }
    let upstreams_conf = config::upstreams_conf_of(main.as_ref(), main_path);
    if let Some(upstreams_conf) = upstreams_conf {
        files.push(upstreams_conf.display().to_string());
        files.extend(
            config::conf_d_files(&upstreams_conf)
                .iter()
                .map(|p| p.display().to_string()),
        );
        if let Some(ups) = config::load_upstreams(&upstreams_conf, &mut issues) {
            shape = Some(ups.shape);
            if let Some(main) = &main {
                config::across::check(main, &ups, &mut issues);
            }
        } else {
            // A broken conf.d file left the shape upstreams.yaml itself was read in unsaid.
            shape = shape_of_file(&upstreams_conf);
        }
    }
    issues.in_file_order();
    Report {
        issues,
        shape,
        files,
    }
}

/// The shape of the upstreams file on its own (its issues are said by the whole load).
fn shape_of_file(path: &Path) -> Option<Shape> {
    let bytes = config::file_bytes::read_regular(path, config::yaml::MAX_FILE_BYTES).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    let mut unsaid = Issues::default();
    let cfg = config::parse_upstreams_text(text, &path.display().to_string(), &mut unsaid)?;
    (!unsaid.has_errors()).then_some(cfg.shape)
}

/// Loads the certificates main.yaml names as the start will: each problem the start would say
/// is a warning (as it is then), and pairs of the certificate directory that do not load are
/// an error too (the start skips them), as is a pair of the admin API that does not load (the
/// start fails on it). Each at its key's line.
pub(crate) fn check_certificates(main: &MainConfig, main_path: &Path, issues: &mut Issues) {
    let mains = MainText::read(main_path);
    let tls = main.proxy_address_tls.is_some();
    check_certificate_folder(main, &mains, tls, issues);
    if let (Some(crt), Some(key)) = (&main.config_tls_certificate, &main.config_tls_key_file) {
        if let Err(e) = crate::tls::single_pair_config(crt, key) {
            let keys = ["config_tls_certificate"];
            let why = format!("cannot start the admin API: its certificate does not load: {e}");
            issues.push(Severity::Error, &mains.file, mains.at(&keys), keys[0], why);
        }
    }
}

/// main.yaml's name and text, for positions its tree does not keep.
struct MainText {
    file: Arc<str>,
    text: String,
}

impl MainText {
    fn read(main_path: &Path) -> MainText {
        let text = config::file_bytes::read_regular(main_path, config::yaml::MAX_FILE_BYTES)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default();
        MainText {
            file: main_path.display().to_string().into(),
            text,
        }
    }

    fn at(&self, keys: &[&str]) -> Pos {
        line_of(&self.text, keys)
    }
}

/// The certificate folder's part of [`check_certificates`], when a TLS listener (`tls`) would
/// serve it.
fn check_certificate_folder(main: &MainConfig, mains: &MainText, tls: bool, issues: &mut Issues) {
    let Some(dir) = main.certificates_dir.as_ref().filter(|_| tls) else {
        return;
    };
    // The folder is proxy_certificates when written, else proxy_configs' (both were named
    // proxy_certificates, at whichever came first).
    let key = match written_at(&mains.text, "proxy_certificates") {
        Some(_) => ["proxy_certificates"],
        None => ["proxy_configs"],
    };
    let (file, at) = (&mains.file, mains.at(&key));
    let (store, problems) = crate::tls::store::CertStore::open(dir);
    for problem in problems {
        issues.push(Severity::Warning, file, at, key[0], problem);
    }
    // The start serves without them (a warning then), but the names they were for get
    // another certificate: a check fails on them, as `nginx -t` does.
    let not_loaded = store.pairs_not_loaded();
    if !not_loaded.is_empty() {
        let why = format!(
            "certificate pair(s) that do not load (said above): {}; their names would get another certificate",
            not_loaded.join(", ")
        );
        issues.push(Severity::Error, file, at, key[0], why);
    }
    if store.is_empty() && main.acme.is_none() {
        let why = format!(
            "no usable certificate pair in {}: TLS handshakes fail until one is added",
            dir.display()
        );
        issues.push(Severity::Warning, file, at, key[0], why);
    }
}

/// Where the first of `keys` is set at the top of a YAML file (line 1 if none is).
fn line_of(text: &str, keys: &[&str]) -> Pos {
    let first = keys
        .iter()
        .filter_map(|k| written_at(text, k))
        .min_by_key(|p| p.line);
    first.unwrap_or(Pos { line: 1, column: 1 })
}

/// Where `key` is set at the top of a YAML file (quoted or not).
fn written_at(text: &str, key: &str) -> Option<Pos> {
    let (line, _) = config::top_level_key_lines(text, key).next()?;
    Some(Pos { line, column: 1 })
}

/// Human-readable report, one line per issue, then a summary.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    for issue in &report.issues.list {
        out.push_str(&issue.to_string());
        out.push('\n');
    }
    let shape = match report.shape {
        Some(Shape::Current) => "routes under `upstreams:` (Aralez v0.92 shape)",
        Some(Shape::Legacy) => "hosts at the top level (older Aralez README shape)",
        None => "not determined",
    };
    out.push_str(&format!(
        "checked {}: {} error(s), {} warning(s); upstreams shape: {shape}\n",
        report.files.join(", "),
        report.error_count(),
        report.warning_count()
    ));
    out
}

#[derive(serde::Serialize)]
struct JsonReport<'a> {
    ok: bool,
    errors: usize,
    warnings: usize,
    shape: Option<&'static str>,
    files: &'a [String],
    issues: &'a [Issue],
}

/// Machine-readable report.
pub fn render_json(report: &Report) -> String {
    let json = JsonReport {
        ok: report.error_count() == 0,
        errors: report.error_count(),
        warnings: report.warning_count(),
        shape: report.shape.map(|s| match s {
            Shape::Current => "upstreams",
            Shape::Legacy => "top-level",
        }),
        files: &report.files,
        issues: &report.issues.list,
    };
    serde_json::to_string_pretty(&json).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Whether the report should fail a CI job.
pub fn failed(report: &Report, deny_warnings: bool) -> bool {
    report
        .issues
        .list
        .iter()
        .any(|i| i.severity == Severity::Error || deny_warnings)
}
