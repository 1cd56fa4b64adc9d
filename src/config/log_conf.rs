//! The log keys of `main.yaml` (SPEC §14, operators): Aralez 0.95's `log_file: "path, max MB,
//! keep, compress"` rotation form (also taken by `access_log_file`), `log_pattern` for the app
//! log's lines, and `access_log_format`. Only parsing and validation live here; writing is
//! `logfile`'s, `process::logging`'s and `accesslog`'s.

use std::path::PathBuf;

/// When a log file is rotated and what is kept of the old ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// The file is rotated once it reaches this size.
    pub max_bytes: u64,
    /// Rotated files kept (`path.1` ... `path.N`); older ones are removed.
    pub keep: u32,
    /// Rotated files are gzipped (`path.1.gz`).
    pub compress: bool,
}

/// A log destination: a path, rotated by size when the key said how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogTarget {
    pub path: PathBuf,
    pub rotation: Option<Rotation>,
}

/// The largest `max MB` accepted (1 TiB).
const MAX_MB: u64 = 1 << 20;
/// The most rotated files kept.
const MAX_KEEP: u64 = 1000;

/// Reads `path` or `path, max MB, keep, compress` (keep and compress may be left out: 5 files,
/// not compressed, as Aralez).
pub fn parse_log_target(text: &str) -> Result<LogTarget, String> {
    let mut parts = text.split(',').map(str::trim);
    let path = parts.next().unwrap_or_default();
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    let path = PathBuf::from(path);
    let Some(max_mb) = parts.next() else {
        return Ok(LogTarget {
            path,
            rotation: None,
        });
    };
    let max_mb = number(max_mb, "max MB", 1, MAX_MB)?;
    let keep = match parts.next() {
        Some(keep) => number(keep, "keep", 0, MAX_KEEP)?,
        None => 5,
    };
    let compress = match parts.next() {
        Some(c) => flag(c)?,
        None => false,
    };
    if let Some(extra) = parts.next() {
        return Err(format!(
            "unexpected `{extra}`: the form is \"path, max MB, keep, compress\""
        ));
    }
    Ok(LogTarget {
        path,
        rotation: Some(Rotation {
            max_bytes: max_mb * 1024 * 1024,
            keep: keep as u32,
            compress,
        }),
    })
}

fn number(text: &str, what: &str, min: u64, max: u64) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{what} `{text}` is not a whole number from {min} to {max} (the form is \"path, max MB, keep, compress\")"
        )),
    }
}

fn flag(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" | "gzip" | "gz" | "compress" => Ok(true),
        "false" | "no" | "off" | "0" | "none" | "" => Ok(false),
        _ => Err(format!(
            "compress `{text}` is not true or false (the form is \"path, max MB, keep, compress\")"
        )),
    }
}

/// How access log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AccessLogFormat {
    /// `key=value` pairs (README, "Access log").
    #[default]
    Logfmt,
    /// One JSON object per line.
    Json,
}

/// One piece of a `log_pattern`, in log4rs's syntax (what Aralez 0.95 uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PatternPiece {
    Text(String),
    /// `{d}` (RFC 3339, UTC, milliseconds) or `{d(strftime)}` with `%Y %m %d %H %M %S %.3f %z %F %T %%`.
    Date(Option<String>),
    /// `{l}`: the level, `{l:<5}`-style padding allowed.
    Level(Padding),
    /// `{m}`: the message and its fields.
    Message,
    /// `{t}`: where the event came from (the module path).
    Target(Padding),
    /// `{T}`: the thread's name.
    Thread(Padding),
    /// `{P}`: the process id.
    Pid,
    /// `{n}`: a line break.
    Newline,
}

/// A `:<5` / `:>5` / `:5` width (left-aligned by default, as log4rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Padding {
    pub width: usize,
    pub right: bool,
}

/// The strftime conversions a `{d(...)}` may use.
const DATE_CONVERSIONS: &[char] = &['Y', 'm', 'd', 'H', 'M', 'S', 'z', '%', 'T', 'F'];

/// Parses a `log_pattern`. A pattern without `{m}` is refused (lines would say nothing); a
/// trailing `{n}` is implied when missing.
pub fn parse_log_pattern(text: &str) -> Result<Vec<PatternPiece>, String> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        match c {
            '{' if rest.starts_with('{') => {
                literal.push('{');
                rest = &rest[1..];
            }
            '}' if rest.starts_with('}') => {
                literal.push('}');
                rest = &rest[1..];
            }
            '{' => {
                let (spec, after) = take_spec(rest)?;
                rest = after;
                if !literal.is_empty() {
                    pieces.push(PatternPiece::Text(std::mem::take(&mut literal)));
                }
                pieces.push(piece(spec)?);
            }
            '}' => return Err("a `}` with no `{` (write `}}` for a brace)".into()),
            c => literal.push(c),
        }
    }
    if !literal.is_empty() {
        pieces.push(PatternPiece::Text(literal));
    }
    if !pieces.contains(&PatternPiece::Message) {
        return Err("the pattern has no `{m}` (the message)".into());
    }
    if pieces.last() != Some(&PatternPiece::Newline) {
        pieces.push(PatternPiece::Newline);
    }
    Ok(pieces)
}

/// Splits `name(arg):pad}rest` at its closing brace (parentheses may hold braces).
fn take_spec(text: &str) -> Result<(&str, &str), String> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            '}' if depth == 0 => return Ok((&text[..i], &text[i + 1..])),
            _ => {}
        }
    }
    Err("a `{` is never closed".into())
}

fn piece(spec: &str) -> Result<PatternPiece, String> {
    let (head, padding) = match spec.rfind(':') {
        Some(i) if !spec[i..].contains(')') => (&spec[..i], padding(&spec[i + 1..])?),
        _ => (spec, Padding::default()),
    };
    let (name, arg) = match head.find('(') {
        Some(i) if head.ends_with(')') => (&head[..i], Some(&head[i + 1..head.len() - 1])),
        Some(_) => return Err(format!("`{{{spec}}}`: unbalanced parentheses")),
        None => (head, None),
    };
    let piece = match (name, arg) {
        ("d" | "date", None) => PatternPiece::Date(None),
        ("d" | "date", Some(arg)) => {
            // log4rs's second argument is the time zone: `{d(%H:%M)(utc)}`. Times are UTC here.
            let format = match arg.split_once(")(") {
                Some((format, "utc")) => format,
                Some((_, zone)) => {
                    return Err(format!(
                        "`{{{spec}}}`: times are written in UTC; `({zone})` is not available (write `(utc)` or nothing)"
                    ))
                }
                None => arg,
            };
            check_date_format(format)?;
            PatternPiece::Date(Some(format.to_string()))
        }
        ("l" | "level", None) => PatternPiece::Level(padding),
        ("m" | "message", None) => PatternPiece::Message,
        ("t" | "target" | "M" | "module", None) => PatternPiece::Target(padding),
        ("T" | "thread", None) => PatternPiece::Thread(padding),
        ("P" | "pid", None) => PatternPiece::Pid,
        ("n", None) => PatternPiece::Newline,
        // log4rs's highlight wraps another piece; aralez writes no colours into files.
        ("h" | "highlight", Some(inner)) => return single(inner),
        _ => {
            return Err(format!(
                "`{{{spec}}}` is not a known piece: {{d}}, {{d(format)}}, {{l}}, {{m}}, {{t}}, {{T}}, {{P}}, {{n}}, {{h(...)}}"
            ))
        }
    };
    Ok(piece)
}

/// `{h({l})}`: the one piece inside a highlight.
fn single(inner: &str) -> Result<PatternPiece, String> {
    let inner = inner.trim();
    match inner.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
        Some(spec) => piece(spec),
        None => Err(format!("`{{h({inner})}}`: expected one `{{piece}}` inside")),
    }
}

fn padding(text: &str) -> Result<Padding, String> {
    let (right, width) = match text.as_bytes().first() {
        Some(b'<') => (false, &text[1..]),
        Some(b'>') => (true, &text[1..]),
        _ => (false, text),
    };
    // log4rs's `.max` truncation part is accepted and ignored.
    let width = width.split('.').next().unwrap_or_default();
    match width.parse::<usize>() {
        Ok(w) if w <= 64 => Ok(Padding { width: w, right }),
        _ => Err(format!("padding `:{text}` is not a width from 0 to 64")),
    }
}

fn check_date_format(format: &str) -> Result<(), String> {
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        let mut next = chars.next();
        if next == Some('.') {
            next = chars.next();
        }
        match next {
            Some('3' | '6' | '9') if chars.next() == Some('f') => {}
            Some(c) if DATE_CONVERSIONS.contains(&c) => {}
            Some(c) => return Err(format!("date format `{format}`: `%{c}` is not supported (use %Y %m %d %H %M %S %.3f %.6f %.9f %z %F %T %%)")),
            None => return Err(format!("date format `{format}` ends in `%`")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_read_aralez_rotation_form() {
        let t = parse_log_target("/var/log/aralez.log, 100, 7, true").unwrap();
        assert_eq!(t.path, PathBuf::from("/var/log/aralez.log"));
        assert_eq!(
            t.rotation,
            Some(Rotation {
                max_bytes: 100 << 20,
                keep: 7,
                compress: true
            })
        );
        assert_eq!(parse_log_target("a.log").unwrap().rotation, None);
        let short = parse_log_target("a.log,1").unwrap().rotation.unwrap();
        assert_eq!((short.keep, short.compress), (5, false));
        // The words an operator writes for a switch (Aralez took anything but `compress` as no).
        for (word, compress) in [("off", false), ("0", false), ("on", true), ("1", true)] {
            let t = parse_log_target(&format!("a.log, 1, 2, {word}")).unwrap();
            assert_eq!(t.rotation.unwrap().compress, compress, "{word}");
        }
        for bad in [
            "",
            " , 5",
            "a.log, 0",
            "a.log, x",
            "a.log, 5, -1",
            "a.log, 5, 2, maybe",
            "a.log,1,2,true,9",
        ] {
            assert!(parse_log_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn patterns_parse_log4rs_pieces() {
        let p = parse_log_pattern("{d(%Y-%m-%d %H:%M:%S%.3f)} [{h({l})}] {{x}} {t}: {m}").unwrap();
        assert_eq!(
            p,
            vec![
                PatternPiece::Date(Some("%Y-%m-%d %H:%M:%S%.3f".into())),
                PatternPiece::Text(" [".into()),
                PatternPiece::Level(Padding::default()),
                PatternPiece::Text("] {x} ".into()),
                PatternPiece::Target(Padding::default()),
                PatternPiece::Text(": ".into()),
                PatternPiece::Message,
                PatternPiece::Newline,
            ]
        );
        assert_eq!(
            parse_log_pattern("{l:>5} {m}").unwrap()[0],
            PatternPiece::Level(Padding {
                width: 5,
                right: true
            })
        );
        // log4rs's time zone argument: UTC is what is written (it printed `)(utc` as text).
        assert_eq!(
            parse_log_pattern("{d(%H:%M)(utc)} {m}").unwrap()[0],
            PatternPiece::Date(Some("%H:%M".into()))
        );
        for bad in [
            "{d}",
            "{m",
            "{q} {m}",
            "} {m}",
            "{d(%Q)} {m}",
            "{l:x} {m}",
            "{d(%H)(local)} {m}",
        ] {
            assert!(parse_log_pattern(bad).is_err(), "{bad}");
        }
    }
}
