//! Config problems as data: each one names its file, line, column, key and reason.
//!
//! Readers push issues into an [`Issues`] list instead of returning at the first one, so
//! `check-config` can report everything in one run. Errors reject the config; warnings do not.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::yaml::Pos;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem found in a config file.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Issue {
    pub severity: Severity,
    pub file: Arc<str>,
    pub line: u32,
    pub column: u32,
    /// Dotted path of the key at fault, e.g. `upstreams.example.com.paths./api.servers[1]`.
    pub key: String,
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{}:{}:{}: {level}: `{}`: {}",
            Escaped(&self.file),
            self.line,
            self.column,
            Escaped(&self.key),
            Escaped(&self.message)
        )
    }
}

/// Text from a config file (a key's name, a message quoting it) shown with its control
/// characters escaped: a newline or a terminal escape in a key must not forge a log line or
/// rewrite the operator's terminal.
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(char::is_control) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            write!(f, "{}", c.escape_default())?;
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// The issues found so far, and the file they are being found in.
#[derive(Debug, Default)]
pub struct Issues {
    pub list: Vec<Issue>,
    /// Known to have no master secret (neither `master_key` nor `JWT_KEY`): a `jwt` rule
    /// without `data` is then an error. False when not known (a file read on its own).
    pub no_master_secret: bool,
    /// Where route settings that a check across files looks at (`to_https`, `acme`) were first
    /// set true (`cache_ttl`: set at all): that check needs main.yaml too, and points there
    /// ([`super::across`]).
    pub first_true: BTreeMap<&'static str, SetAt>,
}

/// Where a setting was read: its file, its place and its whole key path.
#[derive(Clone, Debug)]
pub struct SetAt {
    pub file: Arc<str>,
    pub pos: Pos,
    pub key: String,
}

impl Issues {
    /// Each file's issues by line and column, the files in the order they were first named: a
    /// check across files, or one made once a file was read, came after issues further down.
    pub fn in_file_order(&mut self) {
        let mut files: Vec<Arc<str>> = Vec::new();
        for issue in &self.list {
            if !files.contains(&issue.file) {
                files.push(issue.file.clone());
            }
        }
        let rank = |file: &Arc<str>| files.iter().position(|f| f == file);
        self.list
            .sort_by_key(|issue| (rank(&issue.file), issue.line, issue.column));
    }

    pub fn push(
        &mut self,
        severity: Severity,
        file: &Arc<str>,
        pos: Pos,
        key: &str,
        message: String,
    ) {
        self.list.push(Issue {
            severity,
            file: file.clone(),
            line: pos.line,
            column: pos.column,
            key: key.to_string(),
            message,
        });
    }

    pub fn has_errors(&self) -> bool {
        self.list.iter().any(|i| i.severity == Severity::Error)
    }

    pub fn errors(&self) -> impl Iterator<Item = &Issue> {
        self.list.iter().filter(|i| i.severity == Severity::Error)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Issue> {
        self.list.iter().filter(|i| i.severity == Severity::Warning)
    }
}

/// The known name closest to `unknown`, when it is close enough to be a likely typo, or else
/// the one it begins (`redirect` for `redirect_to`: past the typo's edits, but what was meant).
pub fn did_you_mean<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let unknown = unknown.to_ascii_lowercase();
    let limit = (unknown.len() / 3).clamp(1, 3);
    let close = known
        .iter()
        .map(|k| (edit_distance(&unknown, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k);
    let begun = || {
        let mut begun = known.iter().filter(|k| k.starts_with(unknown.as_str()));
        match (begun.next(), begun.next()) {
            (Some(only), None) if unknown.len() >= 4 => Some(*only),
            _ => None,
        }
    };
    close.or_else(begun)
}

/// Edits between `a` and `b`, two letters swapped counting as one (`emial` is one from
/// `email`: the commonest typo, which plain edit distance counted as two, past the limit).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
            let swapped = i > 0 && j > 0 && *ca == b[j - 1] && a[i - 1] == *cb;
            if swapped {
                cur[j + 1] = cur[j + 1].min(before[j - 1] + 1);
            }
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's issues by line, the files in the order first named (a check made after the
    /// file was read put line 7 before line 5).
    #[test]
    fn issues_come_in_file_then_line_order() {
        let mut issues = Issues::default();
        let (main, ups): (Arc<str>, Arc<str>) = ("main.yaml".into(), "upstreams.yaml".into());
        for (file, line) in [(&main, 7), (&ups, 2), (&main, 5), (&ups, 1)] {
            let pos = Pos { line, column: 1 };
            issues.push(Severity::Error, file, pos, "k", "m".into());
        }
        issues.in_file_order();
        let order: Vec<(&str, u32)> = issues.list.iter().map(|i| (&*i.file, i.line)).collect();
        let expected = [
            ("main.yaml", 5),
            ("main.yaml", 7),
            ("upstreams.yaml", 1),
            ("upstreams.yaml", 2),
        ];
        assert_eq!(order, expected);
    }

    #[test]
    fn control_characters_in_keys_and_messages_are_shown_escaped() {
        let issue = Issue {
            severity: Severity::Warning,
            file: "up.yaml".into(),
            line: 3,
            column: 1,
            key: "x\n2026 INFO forged\u{1b}[2J".into(),
            message: "unknown key `x\n2026 INFO forged\u{1b}[2J`".into(),
        };
        let shown = issue.to_string();
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.contains("x\\n2026 INFO forged\\u{1b}[2J"), "{shown}");
    }

    #[test]
    fn suggests_close_keys_only() {
        let known = ["rate_limit", "x4xx_limit", "servers", "to_https"];
        assert_eq!(did_you_mean("rate_limt", &known), Some("rate_limit"));
        assert_eq!(did_you_mean("server", &known), Some("servers"));
        assert_eq!(did_you_mean("RATE_LIMIT", &known), Some("rate_limit"));
        assert_eq!(did_you_mean("colour", &known), None);
        // Two letters swapped are one edit.
        assert_eq!(did_you_mean("emial", &["email", "domains"]), Some("email"));
        assert_eq!(did_you_mean("sevrers", &known), Some("servers"));
        // The start of one key only.
        let known = ["redirect_to", "rate_limit", "to_https"];
        assert_eq!(did_you_mean("redirect", &known), Some("redirect_to"));
        assert_eq!(did_you_mean("Redirect", &known), Some("redirect_to"));
        assert_eq!(did_you_mean("to", &known), None);
        assert_eq!(did_you_mean("rate", &["rate_limit", "rate_burst"]), None);
    }
}
