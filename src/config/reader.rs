//! Typed reads from the spanned YAML tree, recording an issue for every value of the wrong shape.
//!
//! Each reader returns `None` after recording why, so callers can carry on and find more problems.

use std::sync::Arc;

use super::issues::{did_you_mean, Issues, Severity};
use super::yaml::{Key, Node, Pos, Value};

/// Reads values out of one file's tree, pushing issues tagged with that file.
pub struct Reader<'a> {
    pub file: Arc<str>,
    pub issues: &'a mut Issues,
    /// upstreams.yaml has a global `authorization` (a host's or path's own is then worth a
    /// word: Aralez let the global one win, here the nearest one does).
    pub global_authorization: bool,
}

impl<'a> Reader<'a> {
    pub fn new(file: Arc<str>, issues: &'a mut Issues) -> Self {
        Reader {
            file,
            issues,
            global_authorization: false,
        }
    }

    pub fn error(&mut self, pos: Pos, key: &str, message: impl Into<String>) {
        self.issues
            .push(Severity::Error, &self.file, pos, key, message.into());
    }

    pub fn warn(&mut self, pos: Pos, key: &str, message: impl Into<String>) {
        self.issues
            .push(Severity::Warning, &self.file, pos, key, message.into());
    }

    pub fn wrong_type(&mut self, node: &Node, key: &str, expected: &str) {
        let kind = node.value.kind();
        let found = match (&node.value, node.written.as_deref()) {
            // As written: `02` was said as "a number `2`", the very thing expected.
            (Value::Int(_) | Value::Float(_), Some(written)) => {
                let why = read_otherwise(written, matches!(node.value, Value::Float(_)));
                format!("{kind} `{}`{why}", shorten(written))
            }
            (Value::Bool(_), Some(written)) => format!("{kind} `{}`", shorten(written)),
            (Value::Str(s), _) => format!("{kind} `{}`", shorten(s)),
            (Value::Int(i), _) => format!("{kind} `{i}`"),
            (Value::Float(f), _) => format!("{kind} `{f}`"),
            (Value::Bool(b), _) => format!("{kind} `{b}`"),
            (Value::Null | Value::Seq(_) | Value::Map(_), _) => kind.to_string(),
        };
        self.error(node.pos, key, format!("expected {expected}, found {found}"));
    }

    /// The entries of a mapping; `null` reads as an empty mapping.
    pub fn map<'n>(&mut self, node: &'n Node, key: &str) -> Option<&'n [(Key, Node)]> {
        match &node.value {
            Value::Map(entries) => Some(entries),
            Value::Null => Some(&[]),
            _ => {
                self.wrong_type(node, key, "a mapping");
                None
            }
        }
    }

    /// A scalar as text: a number or boolean as it was written (`0123` stays `0123`, not the
    /// number 123: a key `0123` was refused as `123`), else printed back.
    pub fn string(&mut self, node: &Node, key: &str) -> Option<String> {
        if let Some(written) = &node.written {
            return Some(written.to_string());
        }
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            Value::Int(i) => Some(i.to_string()),
            Value::Float(f) => Some(f.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => {
                self.wrong_type(node, key, "a string");
                None
            }
        }
    }

    /// A non-empty string.
    pub fn non_empty_string(&mut self, node: &Node, key: &str) -> Option<String> {
        let text = self.string(node, key)?;
        if text.trim().is_empty() {
            self.error(node.pos, key, "must not be empty");
            return None;
        }
        Some(text)
    }

    /// A whole number within `min..=max` (a quoted number is accepted).
    pub fn uint(&mut self, node: &Node, key: &str, min: u64, max: u64) -> Option<u64> {
        let number = match &node.value {
            Value::Int(_) if !written_in_decimal(node) => {
                let written = shorten(node.written.as_deref().unwrap_or_default());
                let why = format!("`{written}` is a number in a form YAML reads but few readers expect (hexadecimal, octal, `_` between digits, or a `+`): write it in decimal digits");
                self.error(node.pos, key, why);
                return None;
            }
            Value::Int(i) => *i,
            Value::Str(s) => match s.trim().parse::<i64>() {
                Ok(i) => i,
                Err(_) => {
                    self.wrong_type(node, key, "a whole number");
                    return None;
                }
            },
            _ => {
                self.wrong_type(node, key, "a whole number");
                return None;
            }
        };
        if number < 0 {
            self.error(
                node.pos,
                key,
                format!("must not be negative (found {number})"),
            );
            return None;
        }
        let number = number as u64;
        if number < min || number > max {
            self.error(
                node.pos,
                key,
                format!("must be between {min} and {max} (found {number})"),
            );
            return None;
        }
        Some(number)
    }

    /// A boolean; `yes`/`no`/`on`/`off` and quoted forms are accepted.
    pub fn boolean(&mut self, node: &Node, key: &str) -> Option<bool> {
        match &node.value {
            Value::Bool(b) => Some(*b),
            Value::Str(s) => match bool_word(s) {
                Some(b) => Some(b),
                None => {
                    self.wrong_type(node, key, "true or false");
                    None
                }
            },
            _ => {
                self.wrong_type(node, key, "true or false");
                None
            }
        }
    }

    /// A list of strings with their positions; a single string reads as a one-item list.
    pub fn string_list(&mut self, node: &Node, key: &str) -> Option<Vec<(Pos, String, String)>> {
        match &node.value {
            Value::Seq(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let item_key = format!("{key}[{i}]");
                    if let Some(s) = self.string(item, &item_key) {
                        out.push((item.pos, item_key, s));
                    }
                }
                Some(out)
            }
            Value::Null => Some(Vec::new()),
            Value::Str(s) => Some(vec![(node.pos, key.to_string(), s.clone())]),
            _ => {
                self.wrong_type(node, key, "a list of strings");
                None
            }
        }
    }

    /// Records an unknown key as a warning, suggesting the nearest known one.
    pub fn unknown_key(&mut self, key: &Key, path: &str, known: &[&str]) {
        if let Some(instead) = aralez_key_replaced(&key.name) {
            let message = format!(
                "`{}` (Aralez's) is not read here (ignored): {instead}",
                key.name
            );
            return self.warn(key.pos, path, message);
        }
        let message = match did_you_mean(&key.name, known) {
            // A misspelt `authorization` would serve the route to anyone: an error, as nginx
            // refuses an unknown directive.
            Some(near @ "authorization") => {
                let message = format!("unknown key `{}`, did you mean `{near}`? (the route would be served without it)", key.name);
                return self.error(key.pos, path, message);
            }
            Some(near) => format!("unknown key `{}`, did you mean `{near}`?", key.name),
            None => format!("unknown key `{}` (ignored)", key.name),
        };
        self.warn(key.pos, path, message);
    }
}

/// What replaces a key of some Aralez version's main.yaml that is not read here, for the
/// warning to say it (an operator switching over saw only "unknown key").
fn aralez_key_replaced(name: &str) -> Option<&'static str> {
    Some(match name {
        "cache_size_mb" => "use the `cache:` block (`cache: { storage: memory, mem_size_mb: N }`)",
        "log_structured" | "log_structired" => {
            "structured logs are `access_log_format: json` (no Elasticsearch sink)"
        }
        "sticky_sessions" => {
            "set `sticky_sessions` in upstreams.yaml (globally, or for a host or path)"
        }
        "tls_certificate" | "tls_key_file" => {
            "put the pair in `proxy_certificates`, a directory of `<name>.crt` + `<name>.key` files"
        }
        _ => return None,
    })
}

/// A value quoted back in a message: control characters escaped, long text cut.
pub fn shorten(text: &str) -> String {
    const MAX: usize = 60;
    let mut out = String::new();
    for c in text.chars().take(MAX) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if text.chars().nth(MAX).is_some() {
        out.push_str("...");
    }
    out
}

/// `parent.child`, or `child` at the top.
pub fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else {
        format!("{parent}.{child}")
    }
}

/// The spellings of a boolean in a string: `true`/`yes`/`on`, `false`/`no`/`off`, any case.
pub fn bool_word(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" => Some(true),
        "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Whether a whole number was written in plain decimal digits (or not written at all: a
/// default). `0x10`, `0o10`, `1_000` and `+5` were taken silently as 16, 8, 1000 and 5.
fn written_in_decimal(node: &Node) -> bool {
    let Some(written) = node.written.as_deref() else {
        return true;
    };
    let digits = written.strip_prefix('-').unwrap_or(written);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Why YAML read the number `written` as something else than the whole number it looks like,
/// if that is why: a leading zero, or (when it was read as a `fraction`) its size or its form.
/// A number read as the whole number it is needs no reason (`1` where a mapping was expected
/// was "too large").
fn read_otherwise(written: &str, fraction: bool) -> &'static str {
    let digits = !written.is_empty() && written.bytes().all(|b| b.is_ascii_digit());
    if digits && written.len() > 1 && written.starts_with('0') {
        " (a leading zero: write it without one)"
    } else if !fraction {
        ""
    } else if digits {
        " (too large)"
    } else if written.contains(['.', 'e', 'E']) {
        " (a fraction or an exponent as written: write the whole number in digits)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one message `text`'s `key` gets when read as `read` would read it.
    fn said(text: &str, read: impl Fn(&mut Reader, &Node)) -> String {
        let root = crate::config::yaml::parse(text).expect("YAML");
        let Value::Map(entries) = &root.value else {
            panic!("a mapping");
        };
        let mut issues = Issues::default();
        read(
            &mut Reader::new("t.yaml".into(), &mut issues),
            &entries[0].1,
        );
        let said: Vec<String> = issues.errors().map(|i| i.message.clone()).collect();
        assert_eq!(said.len(), 1, "{text}: {said:?}");
        said[0].clone()
    }

    #[test]
    fn type_errors_give_a_reason_only_where_one_applies() {
        let number = |r: &mut Reader, n: &Node| {
            let _ = r.uint(n, "k", 0, 100);
        };
        let mapping = |r: &mut Reader, n: &Node| {
            let _ = r.map(n, "k");
        };
        // A boolean or a whole number read as what it is needs no reason ("a fraction or an
        // exponent as written", "too large" were said of `true` and of `1`).
        let message = said("k: true\n", number);
        assert_eq!(message, "expected a whole number, found a boolean `true`");
        assert_eq!(
            said("k: 1\n", mapping),
            "expected a mapping, found an integer `1`"
        );
        assert!(said("k: 02\n", number).ends_with("(a leading zero: write it without one)"));
        let large = said("k: 99999999999999999999\n", number);
        assert!(large.ends_with("(too large)"), "{large}");
        for written in ["0x2", "0o10", "1_000", "+5"] {
            let message = said(&format!("k: {written}\n"), number);
            assert!(
                message.contains("write it in decimal digits"),
                "{written}: {message}"
            );
        }
        assert_eq!(
            said("k: 101\n", number),
            "must be between 0 and 100 (found 101)"
        );
    }
}
