//! `aralez check-config` and `-t`: validate everything a start would read and report every issue.

use std::path::Path;

use crate::config::{self, Issue, Issues, Severity, Shape};

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
    let main = config::load_main(main_path, &mut issues);
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
        }
    }
    Report {
        issues,
        shape,
        files,
    }
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
