//! The access log's line formats (`access_log_format`): `logfmt` (the default) and `json`, one
//! line per request, fields always in the same order. Formatting runs on the writer thread, off
//! the request path, into a reused buffer.
//!
//! `araleztoken` query values are replaced by `REDACTED` in both formats: a token must not
//! outlive the request in a log file.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use http::Version;

use super::Entry;
use crate::config::log_conf::AccessLogFormat;
use crate::utc::UtcTime;
use crate::vocab::token_param::QUERY_PARAM;

/// The formatted `YYYY-MM-DDTHH:MM:SS` of the last second seen, reused within that second.
#[derive(Default)]
pub struct Clock {
    second: u64,
    text: String,
}

/// How a value is quoted and escaped in one format.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Logfmt,
    Json,
}

/// Appends one access log line (with its newline) for `e`.
pub fn format_line(out: &mut String, clock: &mut Clock, format: AccessLogFormat, e: &Entry) {
    let style = match format {
        AccessLogFormat::Logfmt => Style::Logfmt,
        AccessLogFormat::Json => Style::Json,
    };
    let mut line = Line { out, style };
    line.open();
    line.time(clock, e.time);
    line.raw_field("client", |out| push_ip(out, e.client));
    line.text("method", e.method.as_ref().map(|m| m.as_str().as_bytes()));
    // Origin form for every version: HTTP/2's absolute URI loses its authority (that is `host`).
    // A CONNECT's target is its authority (`x:1`, which was logged as `/`).
    match &e.target {
        Some(target)
            if e.method == Some(http::Method::CONNECT) && target.path_and_query().is_none() =>
        {
            let authority = target.authority().map_or("", |a| a.as_str());
            line.quoted_field("target", |out| push_escaped(out, authority.as_bytes()));
        }
        Some(target) => {
            let target = target.path_and_query().map_or("/", |p| p.as_str());
            line.quoted_field("target", |out| push_target(out, target));
        }
        None => line.text("target", None),
    }
    line.text("host", e.host.as_ref().map(|h| h.as_bytes()));
    line.text("version", e.version.map(|v| version_name(v).as_bytes()));
    line.number("status", e.status.map(u64::from));
    line.number("bytes", Some(e.bytes));
    line.millis("duration_ms", Some(e.duration));
    line.text("backend", e.backend.as_ref().map(|b| b.as_bytes()));
    match &e.tried {
        Some(tried) => line.quoted_field("tried", |out| push_escaped(out, tried.as_bytes())),
        // JSON lines keep one shape (absent is `null`); logfmt lines leave it out.
        None if line.style == Style::Json => line.text("tried", None),
        None => {}
    }
    line.millis("upstream_ms", e.upstream_time);
    line.text("cache", e.cache.map(str::as_bytes));
    line.number("bytes_in", e.bytes_in);
    line.text("request_id", e.request_id.as_ref().map(|v| v.as_bytes()));
    line.text("tls", e.tls_version.map(str::as_bytes));
    line.text("sni", e.sni.as_ref().map(|s| s.as_bytes()));
    line.text("referer", e.referer.as_ref().map(|v| v.as_bytes()));
    line.text("user_agent", e.user_agent.as_ref().map(|v| v.as_bytes()));
    line.close();
}

fn version_name(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/?",
    }
}

/// One line being written: logfmt's `access key=value ...` or a JSON object.
struct Line<'a> {
    out: &'a mut String,
    style: Style,
}

impl Line<'_> {
    fn open(&mut self) {
        self.out.push_str(if self.style == Style::Json {
            "{"
        } else {
            "access "
        });
    }

    fn close(&mut self) {
        self.out.push_str(if self.style == Style::Json {
            "}\n"
        } else {
            "\n"
        });
    }

    fn key(&mut self, key: &str) {
        match self.style {
            Style::Logfmt => {
                if !self.out.ends_with(' ') {
                    self.out.push(' ');
                }
                self.out.push_str(key);
                self.out.push('=');
            }
            Style::Json => {
                if !self.out.ends_with('{') {
                    self.out.push(',');
                }
                self.out.push('"');
                self.out.push_str(key);
                self.out.push_str("\":");
            }
        }
    }

    /// What an absent value looks like.
    fn absent(&mut self) {
        self.out.push_str(if self.style == Style::Json {
            "null"
        } else {
            "-"
        });
    }

    fn time(&mut self, clock: &mut Clock, time: SystemTime) {
        self.key("time");
        let quote = self.style == Style::Json;
        if quote {
            self.out.push('"');
        }
        write_time(self.out, clock, time);
        if quote {
            self.out.push('"');
        }
    }

    /// A value written as is in logfmt and quoted in JSON (addresses).
    fn raw_field(&mut self, key: &str, write: impl FnOnce(&mut String)) {
        self.key(key);
        let quote = self.style == Style::Json;
        if quote {
            self.out.push('"');
        }
        write(self.out);
        if quote {
            self.out.push('"');
        }
    }

    /// A value always quoted.
    fn quoted_field(&mut self, key: &str, write: impl FnOnce(&mut String)) {
        self.key(key);
        self.out.push('"');
        write(self.out);
        self.out.push('"');
    }

    /// Bytes from the request (header values, names): quoted in logfmt when they may hold
    /// spaces, always quoted in JSON, escaped either way.
    fn text(&mut self, key: &str, value: Option<&[u8]>) {
        self.key(key);
        let Some(bytes) = value else {
            return self.absent();
        };
        let quote = self.style == Style::Json
            || matches!(key, "host" | "referer" | "user_agent" | "sni")
            || !bytes.iter().all(|b| BARE[usize::from(*b)]);
        if quote {
            self.out.push('"');
        }
        push_escaped(self.out, bytes);
        if quote {
            self.out.push('"');
        }
    }

    fn number(&mut self, key: &str, value: Option<u64>) {
        self.key(key);
        match value {
            Some(n) => push_int(self.out, n),
            None => self.absent(),
        }
    }

    /// Milliseconds with three decimals.
    fn millis(&mut self, key: &str, value: Option<Duration>) {
        self.key(key);
        let Some(d) = value else {
            return self.absent();
        };
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        push_int(self.out, micros / 1000);
        self.out.push('.');
        push_padded(self.out, micros % 1000, 3);
    }
}

/// The target with the value of every `araleztoken` query parameter replaced by `REDACTED`.
fn push_target(out: &mut String, target: &str) {
    let Some((path, query)) = target
        .split_once('?')
        .filter(|(_, q)| q.contains(QUERY_PARAM))
    else {
        push_escaped(out, target.as_bytes());
        return;
    };
    push_escaped(out, path.as_bytes());
    for (i, pair) in query.split('&').enumerate() {
        out.push(if i == 0 { '?' } else { '&' });
        match pair.split_once('=') {
            Some((name, _)) if name == QUERY_PARAM => {
                out.push_str(QUERY_PARAM);
                out.push_str("=REDACTED");
            }
            _ => push_escaped(out, pair.as_bytes()),
        }
    }
}

fn push_int(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// `n` with leading zeros to `width` digits.
fn push_padded(out: &mut String, n: u64, width: usize) {
    let mut buf = itoa::Buffer::new();
    let digits = buf.format(n);
    for _ in digits.len()..width {
        out.push('0');
    }
    out.push_str(digits);
}

fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_int(out, u64::from(*octet));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// The bytes a logfmt value may hold unquoted: printable ASCII but `"`, `\\` and `=`.
static BARE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0x21;
    while b < 0x7f {
        table[b] = !matches!(b as u8, b'"' | b'\\' | b'=');
        b += 1;
    }
    table
};

/// Copies printable ASCII and spaces; `"` and `\\` become `\\"` and `\\\\`, other ASCII bytes
/// `\\u00NN`, so a line stays one line of valid text. Both formats take JSON's escapes: a logfmt
/// reader (go-logfmt, Loki's `| logfmt`) knows no other inside quotes. UTF-8 text stays as it is
/// (a byte as `\\u00NN` would read as another character: `é` as `Ã©`), and a byte that is not
/// UTF-8 becomes U+FFFD.
fn push_escaped(out: &mut String, bytes: &[u8]) {
    let plain = |b: &u8| (b.is_ascii_graphic() && *b != b'"' && *b != b'\\') || *b == b' ';
    let mut rest = bytes;
    while !rest.is_empty() {
        let run = rest.iter().position(|b| !plain(b)).unwrap_or(rest.len());
        // The run is printable ASCII, hence UTF-8.
        out.push_str(std::str::from_utf8(&rest[..run]).unwrap_or_default());
        let Some(&odd) = rest.get(run) else { break };
        rest = &rest[run..];
        if !odd.is_ascii() {
            rest = push_non_ascii(out, rest);
            continue;
        }
        let _ = match odd {
            b'"' => out.write_str("\\\""),
            b'\\' => out.write_str("\\\\"),
            _ => write!(out, "\\u{odd:04x}"),
        };
        rest = &rest[1..];
    }
}

/// Copies the UTF-8 character `bytes` starts with, or writes U+FFFD for a byte that starts none;
/// returns what follows.
fn push_non_ascii<'a>(out: &mut String, bytes: &'a [u8]) -> &'a [u8] {
    let len = match bytes.first() {
        Some(0xc2..=0xdf) => 2,
        Some(0xe0..=0xef) => 3,
        Some(0xf0..=0xf4) => 4,
        _ => 1,
    };
    match bytes.get(..len).map(std::str::from_utf8) {
        Some(Ok(character)) if len > 1 => {
            out.push_str(character);
            &bytes[len..]
        }
        _ => {
            out.push_str("\\ufffd");
            bytes.get(1..).unwrap_or_default()
        }
    }
}

/// RFC 3339 UTC with milliseconds; the part up to the second is formatted once per second.
fn write_time(out: &mut String, clock: &mut Clock, time: SystemTime) {
    let t = UtcTime::of(time);
    if clock.text.is_empty() || clock.second != t.epoch_second {
        clock.text.clear();
        let _ = write!(
            clock.text,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            t.year, t.month, t.day, t.hour, t.minute, t.second
        );
        clock.second = t.epoch_second;
    }
    out.push_str(&clock.text);
    out.push('.');
    push_padded(out, u64::from(t.nanos / 1_000_000), 3);
    out.push('Z');
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Method};
    use std::time::{Instant, UNIX_EPOCH};

    fn entry() -> Entry {
        Entry {
            time: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            start: Instant::now(),
            client: "10.0.0.1".parse().unwrap(),
            method: Some(Method::GET),
            target: Some("/a?b=1".parse().unwrap()),
            version: Some(Version::HTTP_11),
            host: Some(HeaderValue::from_static("x\".org")),
            status: Some(200),
            bytes: 5,
            duration: Duration::from_micros(1500),
            backend: None,
            tried: None,
            upstream_time: None,
            cache: None,
            bytes_in: Some(0),
            request_id: Some(HeaderValue::from_static("r-1")),
            tls_version: None,
            sni: None,
            referer: None,
            user_agent: Some(HeaderValue::from_static("curl/8 (x)")),
        }
    }

    #[test]
    fn tokens_never_reach_the_log() {
        let mut out = String::new();
        push_target(&mut out, "/a?x=1&araleztoken=eyJ.secret.sig&y=2");
        assert_eq!(out, "/a?x=1&araleztoken=REDACTED&y=2");
        out.clear();
        push_target(&mut out, "/a?araleztokenx=1");
        assert_eq!(out, "/a?araleztokenx=1");
    }

    /// Reads a logfmt line as go-logfmt does: `key=bare` (no space, `=`, `"`, `\\` or control
    /// byte) or `key="..."` with JSON's escapes (read by serde_json, as a JSON string is the same).
    fn read_logfmt(line: &str) -> Vec<(String, String)> {
        let mut fields = Vec::new();
        let mut rest = line
            .trim_end_matches('\n')
            .strip_prefix("access ")
            .expect("access");
        while !rest.is_empty() {
            let (key, after) = rest.split_once('=').expect("key=");
            assert!(!key.contains([' ', '"']), "key {key:?} in {line}");
            let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
                let mut end = 0;
                let bytes = quoted.as_bytes();
                while bytes[end] != b'"' {
                    end += if bytes[end] == b'\\' { 2 } else { 1 };
                }
                let literal = &after[..end + 2];
                let value: String = serde_json::from_str(literal).expect(literal);
                (value, &quoted[end + 1..])
            } else {
                let end = after.find(' ').unwrap_or(after.len());
                let bare = &after[..end];
                assert!(
                    !bare.contains(['=', '"', '\\']) && !bare.chars().any(char::is_control),
                    "bare {bare:?} in {line}"
                );
                (bare.to_string(), &after[end..])
            };
            fields.push((key.to_string(), value));
            rest = after.strip_prefix(' ').unwrap_or(after);
        }
        fields
    }

    #[test]
    fn logfmt_values_read_back_as_sent_whatever_the_client_put_in_them() {
        let mut e = entry();
        e.user_agent =
            Some(HeaderValue::from_bytes(b"a\"b\\c\tq\xff\xc3\xa9 x=1 status=999").unwrap());
        e.host = Some(HeaderValue::from_bytes("é.local".as_bytes()).unwrap());
        e.request_id = Some(HeaderValue::from_static("a=b\"c\\d"));
        e.referer = Some(HeaderValue::from_static("http://r/?q=1"));
        let mut line = String::new();
        format_line(
            &mut line,
            &mut Clock::default(),
            AccessLogFormat::Logfmt,
            &e,
        );
        let fields = read_logfmt(&line);
        let field = |k: &str| {
            fields
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(fields.len(), 18, "{line}");
        assert_eq!(
            field("user_agent"),
            Some("a\"b\\c\tq\u{fffd}é x=1 status=999")
        );
        assert_eq!(field("status"), Some("200"));
        assert_eq!(field("host"), Some("é.local"));
        assert_eq!(field("request_id"), Some("a=b\"c\\d"));
        assert_eq!(field("referer"), Some("http://r/?q=1"));
    }

    #[test]
    fn logfmt_line_has_every_field_and_escapes_quotes() {
        let mut line = String::new();
        format_line(
            &mut line,
            &mut Clock::default(),
            AccessLogFormat::Logfmt,
            &entry(),
        );
        assert_eq!(
            line,
            "access time=2023-11-14T22:13:20.123Z client=10.0.0.1 method=GET target=\"/a?b=1\" \
             host=\"x\\\".org\" version=HTTP/1.1 status=200 bytes=5 duration_ms=1.500 backend=- \
             upstream_ms=- cache=- bytes_in=0 request_id=r-1 tls=- sni=- referer=- user_agent=\"curl/8 (x)\"\n"
        );
    }

    #[test]
    fn json_line_is_one_valid_object() {
        let mut e = entry();
        e.referer = Some(HeaderValue::from_bytes(b"http://r/\t\xff").unwrap());
        e.tls_version = Some("TLSv1.3");
        e.upstream_time = Some(Duration::from_micros(1200));
        e.cache = Some("HIT");
        let mut line = String::new();
        format_line(&mut line, &mut Clock::default(), AccessLogFormat::Json, &e);
        assert!(line.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["host"], "x\".org");
        assert_eq!(v["status"], 200);
        assert_eq!(v["backend"], serde_json::Value::Null);
        assert_eq!(v["tried"], serde_json::Value::Null);
        assert!(v.as_object().unwrap().contains_key("tried"), "{v}");
        assert_eq!(v["upstream_ms"], 1.2);
        assert_eq!(v["cache"], "HIT");
        assert_eq!(v["tls"], "TLSv1.3");
        assert_eq!(v["referer"], "http://r/\t\u{fffd}");
        assert_eq!(v["user_agent"], "curl/8 (x)");
        // UTF-8 passes as it is; what is not UTF-8 (a lone continuation byte, a sequence cut
        // short, an overlong one) is U+FFFD, and the line stays valid JSON.
        e.user_agent = Some(HeaderValue::from_bytes("café ü 日本 🦀".as_bytes()).unwrap());
        e.referer = Some(HeaderValue::from_bytes(b"a\x80b\xe6\x97c\xc0\xafd\xe6").unwrap());
        line.clear();
        format_line(&mut line, &mut Clock::default(), AccessLogFormat::Json, &e);
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["user_agent"], "café ü 日本 🦀");
        assert_eq!(
            v["referer"],
            "a\u{fffd}b\u{fffd}\u{fffd}c\u{fffd}\u{fffd}d\u{fffd}"
        );
        assert_eq!(v["time"], "2023-11-14T22:13:20.123Z");
    }
}
