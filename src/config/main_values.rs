//! `main.yaml`'s typed values (addresses, durations, named choices, log settings): the choice
//! types and their readers, each reader reporting a bad value at its key's position and
//! returning `None`.

use std::net::SocketAddr;
use std::time::Duration;

use super::log_conf::{self, LogTarget, PatternPiece};
use super::reader::Reader;
use super::yaml::{Node, Value};

/// Which requests the access log records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AccessLog {
    #[default]
    Off,
    All,
    Errors,
}

/// How strict the TLS listener is (SPEC §7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TlsGrade {
    High,
    #[default]
    Medium,
    Unsafe,
}

pub(super) fn set<T>(slot: &mut T, value: Option<T>) -> bool {
    match value {
        Some(v) => {
            *slot = v;
            true
        }
        None => false,
    }
}

pub(super) fn opt<T>(slot: &mut Option<T>, value: Option<T>) -> bool {
    let ok = value.is_some();
    *slot = value;
    ok
}

pub(super) fn listen(node: &Node, key: &str, r: &mut Reader) -> Option<SocketAddr> {
    let text = r.string(node, key)?;
    match super::values::parse_listen(&text) {
        Ok(addr) => Some(addr),
        Err(msg) => {
            r.error(node.pos, key, msg);
            None
        }
    }
}

pub(super) fn seconds(
    node: &Node,
    key: &str,
    min: u64,
    max: u64,
    r: &mut Reader,
) -> Option<Duration> {
    r.uint(node, key, min, max).map(Duration::from_secs)
}

pub(super) fn one_of<T: Copy>(
    node: &Node,
    key: &str,
    r: &mut Reader,
    choices: &[(&str, T)],
) -> Option<T> {
    let text = r.string(node, key)?;
    let lower = text.to_ascii_lowercase();
    if let Some((_, v)) = choices.iter().find(|(name, _)| *name == lower) {
        return Some(*v);
    }
    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
    let hint = crate::config::issues::did_you_mean(&text, &names)
        .map(|name| format!(" (did you mean `{name}`?)"))
        .unwrap_or_default();
    r.error(
        node.pos,
        key,
        format!("`{text}` is not one of: {}{hint}", names.join(", ")),
    );
    None
}

pub(super) fn read_log_target(node: &Node, key: &str, r: &mut Reader) -> Option<LogTarget> {
    let text = r.non_empty_string(node, key)?;
    log_conf::parse_log_target(&text)
        .map_err(|msg| r.error(node.pos, key, msg))
        .ok()
}

pub(super) fn read_log_pattern(node: &Node, r: &mut Reader) -> Option<Vec<PatternPiece>> {
    let text = r.non_empty_string(node, "log_pattern")?;
    log_conf::parse_log_pattern(&text)
        .map_err(|msg| r.error(node.pos, "log_pattern", msg))
        .ok()
}

pub(super) fn read_log_level(node: &Node, r: &mut Reader) -> Option<String> {
    // YAML 1.1 reads an unquoted `off` (or `no`) as false.
    let levels = [
        ("off", "off"),
        ("false", "off"),
        ("error", "error"),
        ("warn", "warn"),
        ("warning", "warn"),
        ("info", "info"),
        ("debug", "debug"),
        ("trace", "trace"),
    ];
    one_of(node, "log_level", r, &levels).map(str::to_string)
}

pub(super) fn read_access_log(node: &Node, r: &mut Reader) -> Option<AccessLog> {
    let choices = [
        ("off", AccessLog::Off),
        ("false", AccessLog::Off),
        ("all", AccessLog::All),
        ("true", AccessLog::All),
        // Aralez's documented value for "every request".
        ("access", AccessLog::All),
        ("error", AccessLog::Errors),
    ];
    one_of(node, "access_log", r, &choices)
}

/// The grade names, and Aralez's SSL Labs spellings for them: `high` is the A+ profile, `medium`
/// an A; `b` and `c` ask for something weaker, which rustls cannot offer, so they are `unsafe`
/// (as medium, with its warning).
pub(super) fn read_grade(node: &Node, r: &mut Reader) -> Option<TlsGrade> {
    let choices = [
        ("high", TlsGrade::High),
        ("medium", TlsGrade::Medium),
        ("unsafe", TlsGrade::Unsafe),
        ("a+", TlsGrade::High),
        ("a", TlsGrade::Medium),
        ("b", TlsGrade::Unsafe),
        ("c", TlsGrade::Unsafe),
    ];
    let grade = one_of(node, "proxy_tls_grade", r, &choices)?;
    if grade == TlsGrade::Unsafe {
        let why = "unsafe offers the same as medium: rustls has nothing weaker than TLS 1.2 with AEAD suites";
        r.warn(node.pos, "proxy_tls_grade", why);
    }
    let letter = match &node.value {
        Value::Str(text) => choices[3..]
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case(text)),
        _ => false,
    };
    if letter {
        let name = choices
            .iter()
            .find(|(_, g)| *g == grade)
            .map_or("", |c| c.0);
        r.warn(
            node.pos,
            "proxy_tls_grade",
            format!("an Aralez letter grade: read as `{name}` (SPEC: high, medium or unsafe)"),
        );
    }
    Some(grade)
}

pub(super) fn read_hc_method(node: &Node, r: &mut Reader) -> Option<http::Method> {
    let choices = [("head", 0u8), ("get", 1), ("post", 2)];
    one_of(node, "hc_method", r, &choices).map(|i| match i {
        0 => http::Method::HEAD,
        1 => http::Method::GET,
        _ => http::Method::POST,
    })
}

/// `client_max_body_size`, as nginx writes it: bytes, or a number with `k`, `m` or `g` (any
/// case: KiB, MiB, GiB); `0` sets no cap (`Some(None)`).
pub(super) fn read_body_size(node: &Node, key: &str, r: &mut Reader) -> Option<Option<u64>> {
    let written = match &node.value {
        Value::Int(_) => {
            return r
                .uint(node, key, 0, i64::MAX as u64)
                .map(|n| (n > 0).then_some(n))
        }
        Value::Str(text) => text.trim().to_ascii_lowercase(),
        _ => {
            r.wrong_type(node, key, "a size (`10m`, `512k`, `1g` or bytes)");
            return None;
        }
    };
    match parse_body_size(&written) {
        Some(bytes) => Some((bytes > 0).then_some(bytes)),
        None => {
            let why = format!("`{written}` is not a size: bytes, or a number with k, m or g (`10m`); 0 sets no cap");
            r.error(node.pos, key, why);
            None
        }
    }
}

fn parse_body_size(written: &str) -> Option<u64> {
    let (digits, unit) = match written.as_bytes().last()? {
        b'k' => (&written[..written.len() - 1], 1u64 << 10),
        b'm' => (&written[..written.len() - 1], 1 << 20),
        b'g' => (&written[..written.len() - 1], 1 << 30),
        _ => (written, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()?
        .checked_mul(unit)
        .filter(|&n| n <= i64::MAX as u64)
}

#[cfg(test)]
mod body_size_tests {
    use super::parse_body_size;

    #[test]
    fn sizes_are_read_as_nginx_reads_them() {
        for (written, bytes) in [
            ("1024", Some(1024)),
            ("512k", Some(512 << 10)),
            ("10m", Some(10 << 20)),
            ("1g", Some(1 << 30)),
            ("0", Some(0)),
            ("", None),
            ("m", None),
            ("1.5m", None),
            ("-1", None),
            ("10mb", None),
            ("99999999999g", None),
        ] {
            assert_eq!(parse_body_size(written), bytes, "{written:?}");
        }
    }
}
