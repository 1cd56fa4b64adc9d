//! Host and path normalisation for route lookup (SPEC §4).
//!
//! The common case (a short lower-case host, a clean path) allocates nothing: the host is
//! lower-cased into a stack buffer and a clean path is borrowed as is.

use std::borrow::Cow;

/// Longest host name we look up; longer ones fall to `DEFAULT`.
pub const MAX_HOST: usize = 255;

/// Writes the normalised form of a `Host`/`:authority` value into `buf` and returns it:
/// port and trailing dot removed, lower-cased; IPv6 literals keep their brackets. `None` when
/// the value is not a host (RFC 3986's `reg-name` or IP literal, an optional port): empty,
/// longer than [`MAX_HOST`], or with a byte no host name has (a space, `@`, `/`, ...).
pub fn host<'b>(raw: &[u8], buf: &'b mut [u8; MAX_HOST]) -> Option<&'b str> {
    let raw = raw.trim_ascii();
    let (without_port, allowed) = if raw.first() == Some(&b'[') {
        let end = raw.iter().position(|b| *b == b']')?;
        match &raw[end + 1..] {
            [] => {}
            [b':', port @ ..] if port.iter().all(u8::is_ascii_digit) => {}
            _ => return None,
        }
        (&raw[..=end], &IP_LITERAL)
    } else {
        let without_port = match raw.iter().rposition(|b| *b == b':') {
            Some(idx) if raw[idx + 1..].iter().all(u8::is_ascii_digit) => &raw[..idx],
            Some(_) => return None,
            None => raw,
        };
        (without_port, &REG_NAME)
    };
    let name = without_port.strip_suffix(b".").unwrap_or(without_port);
    if name.is_empty() || name.len() > MAX_HOST {
        return None;
    }
    // Every byte is looked at, with no early exit, and then lower-cased as a block (byte by
    // byte with a branch each, a 15-byte host cost about 300 instructions, callgrind).
    let valid = name.iter().fold(true, |ok, &b| ok & allowed[b as usize]);
    if !valid {
        return None;
    }
    if name.first() == Some(&b'[') {
        return ip_literal(name, buf);
    }
    let out = &mut buf[..name.len()];
    out.copy_from_slice(name);
    out.make_ascii_lowercase();
    std::str::from_utf8(out).ok()
}

/// A bracketed IP literal in its one written form (RFC 5952: `[0:0:0:0:0:0:0:1]` and `[::1]`
/// are one host, and routing and the limits must take them as one); one that is no IPv6
/// address (an IPvFuture) as written, lower-cased.
fn ip_literal<'b>(name: &[u8], buf: &'b mut [u8; MAX_HOST]) -> Option<&'b str> {
    let inner = std::str::from_utf8(&name[1..name.len() - 1]).ok()?;
    if let Ok(addr) = inner.parse::<std::net::Ipv6Addr>() {
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        std::io::Write::write_fmt(&mut cursor, format_args!("[{addr}]")).ok()?;
        let len = cursor.position() as usize;
        return std::str::from_utf8(&buf[..len]).ok();
    }
    let out = &mut buf[..name.len()];
    out.copy_from_slice(name);
    out.make_ascii_lowercase();
    std::str::from_utf8(out).ok()
}

/// `host` (normalised) with its IPv6 literal in the one form [`host`] gives requests'.
pub fn canonical_ip_literal(host: &str) -> std::borrow::Cow<'_, str> {
    let bracketed = host.len() > 1 && host.starts_with('[') && host.ends_with(']');
    if !bracketed || host.len() > MAX_HOST {
        return host.into();
    }
    let mut buf = [0u8; MAX_HOST];
    match ip_literal(host.as_bytes(), &mut buf) {
        Some(canonical) if canonical != host => canonical.to_owned().into(),
        _ => host.into(),
    }
}

/// Whether a normalised host has an empty label (`a..b`, `.a`, `a..`): no host is named so,
/// and nginx refuses such a `Host` (400) rather than route it to the default server. Asked
/// only of a host no route names (the common case never pays for it).
pub fn has_empty_label(name: &[u8]) -> bool {
    name.first() == Some(&b'.') || name.last() == Some(&b'.') || name.windows(2).any(|w| w == b"..")
}

/// The bytes of a host name (RFC 3986 `reg-name`: unreserved, sub-delims, `%` of an escape).
static REG_NAME: [bool; 256] = byte_set(b"-._~%!$&'()*+,;=");
/// The bytes of a bracketed IP literal, brackets included.
static IP_LITERAL: [bool; 256] = byte_set(b"[]:.");

/// ASCII letters and digits, and `extra`.
const fn byte_set(extra: &[u8]) -> [bool; 256] {
    let mut set = [false; 256];
    let mut b = 0;
    while b < 256 {
        set[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let mut i = 0;
    while i < extra.len() {
        set[extra[i] as usize] = true;
        i += 1;
    }
    set
}

/// `host` without a trailing `:port` (IPv6 literals keep their brackets).
pub fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// The path as routing judges it: `%XX` of unreserved characters decoded, bytes a path cannot
/// hold as they are (non-ASCII, a space, `"`, `{`, ...) percent-encoded, every escape kept in
/// upper case, dot segments resolved, repeated slashes merged. Config path prefixes are put in
/// the same form ([`prefix`]), so `/café` written in a file matches `/caf%C3%A9` sent by a
/// browser, and the raw `/café` some clients send. Borrowed when nothing needs changing.
pub fn path(raw: &str) -> Cow<'_, str> {
    if !needs_work(raw.as_bytes()) {
        return Cow::Borrowed(raw);
    }
    let decoded = canonical_bytes(raw);
    Cow::Owned(remove_dot_segments(&decoded))
}

/// A path prefix from the config in the form [`path`] gives request paths.
pub fn prefix(written: &str) -> String {
    path(written).into_owned()
}

/// Whether [`path`] would change `bytes`: not starting with `/`, a byte outside
/// [`PLAIN_PATH`] (`%` included), or a `/` followed by `.` or `/`. One pass, no allocation.
fn needs_work(bytes: &[u8]) -> bool {
    if bytes.first() != Some(&b'/') {
        return true;
    }
    let mut after_slash = false;
    for &b in bytes {
        if !PLAIN_PATH[b as usize] || (after_slash && (b == b'.' || b == b'/')) {
            return true;
        }
        after_slash = b == b'/';
    }
    false
}

/// The bytes a path holds as they are (RFC 3986 `pchar` and `/`, without `%`).
static PLAIN_PATH: [bool; 256] = byte_set(b"-._~!$&'()*+,;=:@/");

fn canonical_bytes(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                let c = h * 16 + l;
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    out.push(c);
                } else {
                    // Reserved or non-ASCII: keep the escape, upper-cased so comparisons agree.
                    out.extend([
                        b'%',
                        bytes[i + 1].to_ascii_uppercase(),
                        bytes[i + 2].to_ascii_uppercase(),
                    ]);
                }
                i += 3;
                continue;
            }
        }
        let b = bytes[i];
        if PLAIN_PATH[b as usize] || b == b'%' {
            // A `%` without two hex digits stays (requests with one are refused before routing).
            out.push(b);
        } else {
            out.extend([
                b'%',
                HEX_UPPER[usize::from(b >> 4)],
                HEX_UPPER[usize::from(b & 15)],
            ]);
        }
        i += 1;
    }
    // Every byte out is ASCII.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Every `%XX` of `raw` decoded (a `%` not followed by two hex digits stays as it is).
pub fn percent_decode(raw: &str) -> Vec<u8> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some(hex(*bytes.get(i + 1)?)? * 16 + hex(*bytes.get(i + 2)?)?))
            .flatten();
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `path` with its dot segments resolved and repeated slashes merged, nothing decoded or
/// encoded (for a path already decoded, such as the file server's).
pub fn remove_dot_segments(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    let trailing_slash = path.ends_with('/') || path.ends_with("/.") || path.ends_with("/..");
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(path.len() + 1);
    for seg in &segments {
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() || (trailing_slash && !segments.is_empty()) {
        out.push('/');
    }
    out
}

/// Whether `prefix` matches `path` on a segment boundary (`/api` matches `/api`, `/api/x`, not
/// `/apix`), ignoring ASCII case: `/ADMIN` is `/admin` to many backends, so it must meet
/// `/admin`'s policies here too.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    let (p, q) = (prefix.as_bytes(), path.as_bytes());
    q.len() >= p.len()
        && q[..p.len()].eq_ignore_ascii_case(p)
        && (p.last() == Some(&b'/') || q.len() == p.len() || q[p.len()] == b'/')
}

/// Whether a request path could mean one thing to routing and another to a backend, and so is
/// refused (400) before routing: `;` path parameters (`/public/..;/admin` is `/admin` to
/// Tomcat), encoded separators (`%2F`, `%5C`, and `%3B`) and NUL (`/admin%00` is `/admin` to a
/// backend that stops at it; nginx refuses it too), backslashes, dot segments, plain or
/// encoded, and a `%` not followed by two hex digits (nginx refuses those too: `/%4%34` is
/// `/%44` to one decoder and `/D` to one that decodes twice). What is routed is then exactly
/// what the backend receives.
pub fn is_ambiguous(raw: &str) -> bool {
    let bytes = raw.as_bytes();
    // One pass decides the common case: no `%` and no `.` means no encoded separator and no
    // dot segment.
    let mut suspicious = false;
    for &b in bytes {
        match b {
            b';' | b'\\' => return true,
            b'%' | b'.' => suspicious = true,
            _ => {}
        }
    }
    if !suspicious {
        return false;
    }
    let encoded_separator = bytes.windows(3).any(|w| {
        w[0] == b'%'
            && matches!(
                (w[1], w[2].to_ascii_lowercase()),
                (b'2', b'f') | (b'5', b'c') | (b'3', b'b') | (b'0', b'0')
            )
    });
    if encoded_separator || has_malformed_escape(bytes) {
        return true;
    }
    raw.split('/').any(is_dot_segment)
}

/// Whether some `%` is not followed by two hex digits.
pub fn has_malformed_escape(bytes: &[u8]) -> bool {
    bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

/// `.` or `..`, each dot plain or `%2E`; checked without allocating (this runs per request).
fn is_dot_segment(segment: &str) -> bool {
    let bytes = segment.as_bytes();
    let (mut i, mut dots) = (0, 0);
    while i < bytes.len() {
        if bytes[i] == b'.' {
            i += 1;
        } else if bytes[i] == b'%'
            && bytes.get(i + 1) == Some(&b'2')
            && bytes
                .get(i + 2)
                .is_some_and(|b| b.eq_ignore_ascii_case(&b'e'))
        {
            i += 3;
        } else {
            return false;
        }
        dots += 1;
    }
    dots == 1 || dots == 2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `path` fuzz target: `/%4%34=bg` normalised to `/%44=bg`, which normalises
    /// again to `/D=bg`. A malformed escape is now refused before routing, as nginx does.
    #[test]
    fn malformed_escapes_are_ambiguous() {
        for raw in ["/%4%34=bg", "/%", "/a%2", "/%zz", "/x/%4"] {
            assert!(is_ambiguous(raw), "{raw:?}");
        }
        for raw in ["/%41", "/a%20b", "/%e2%82%ac"] {
            assert!(!is_ambiguous(raw), "{raw:?}");
        }
    }

    /// Found by the `path` fuzz target: non-ASCII bytes were copied as Latin-1 chars, so a
    /// path needing work came out as mojibake (and changed again when normalised twice). They
    /// are percent-encoded now, as a browser sends them.
    #[test]
    fn non_ascii_paths_keep_their_bytes_and_normalise_once() {
        for (raw, want) in [
            ("//a//.\u{463}", "/a/.%D1%A3"),
            ("/%b\u{59d}\u{35a}2ex", "/%b%D6%9D%CD%9A2ex"),
            ("/caf\u{e9}/../%41", "/A"),
        ] {
            let once = path(raw);
            assert_eq!(once, want, "{raw:?}");
            assert_eq!(path(&once), once, "{raw:?} twice");
        }
    }

    fn h(raw: &str) -> Option<String> {
        let mut buf = [0u8; MAX_HOST];
        host(raw.as_bytes(), &mut buf).map(str::to_string)
    }

    /// An IPv6 address written another way (`[0:0:0:0:0:0:0:1]`, upper case, with a port) is
    /// the host its RFC 5952 form names: it went to `DEFAULT`, past its host's `to_https`.
    #[test]
    fn ipv6_literals_take_one_form() {
        for raw in ["[::1]", "[0:0:0:0:0:0:0:1]", "[0::1]:8080", "[::0001]"] {
            assert_eq!(h(raw).as_deref(), Some("[::1]"), "{raw:?}");
        }
        assert_eq!(h("[2001:DB8:0::1]").as_deref(), Some("[2001:db8::1]"));
        assert_eq!(h("[v1.Future]").as_deref(), Some("[v1.future]"));
        assert_eq!(canonical_ip_literal("[0:0::1]"), "[::1]");
        assert_eq!(canonical_ip_literal("a.test"), "a.test");
    }

    #[test]
    fn ambiguous_paths_are_recognised() {
        for raw in [
            "/admin;x",
            "/public/..;/admin",
            "/admin%2Fsecret",
            "/admin%2fsecret",
            "/a%5Cb",
            "/a%3bb",
            "/a\\b",
            "/public/../admin",
            "/./admin",
            "/a/%2e%2e/admin",
            "/a/.%2E/admin",
            "/a/..",
            "/admin%00",
            "/a%00b",
        ] {
            assert!(is_ambiguous(raw), "{raw}");
        }
        for raw in [
            "/",
            "/admin",
            "/a/b.c",
            "/.well-known/x",
            "/a%20b",
            "/a..b/..c",
        ] {
            assert!(!is_ambiguous(raw), "{raw}");
        }
    }

    #[test]
    fn prefixes_match_whatever_the_case() {
        assert!(prefix_matches("/admin", "/ADMIN"));
        assert!(prefix_matches("/admin", "/Admin/x"));
        assert!(!prefix_matches("/admin", "/ADMINX"));
        assert!(prefix_matches("/", "/anything"));
    }

    #[test]
    fn hosts() {
        let cases = [
            ("example.com", Some("example.com")),
            ("Example.COM:8080", Some("example.com")),
            ("example.com.", Some("example.com")),
            ("example.com.:443", Some("example.com")),
            ("[::1]:8080", Some("[::1]")),
            ("[::1]", Some("[::1]")),
            ("127.0.0.1:80", Some("127.0.0.1")),
            ("", None),
            ("a b", None),
            ("host:notaport", None),
            (" \tWWW.Example.com \r\n", Some("www.example.com")),
            ("a\tb", None),
            ("a\x7fb", None),
            ("a\x00b", None),
            ("ex\u{e4}mple.com", None),
            ("!~AZ_-$&'()*+,;=%41", Some("!~az_-$&'()*+,;=%41")),
            ("[::FFFF:1.2.3.4]", Some("[::ffff:1.2.3.4]")),
            // Not host names: userinfo, a path, brackets out of place, a port after junk.
            ("user@example.com", None),
            ("example.com/x", None),
            ("a[b]", None),
            ("[::1]x", None),
            ("[::1]:x", None),
            ("[a@b]", None),
            ("a:b:80", None),
            ("a\"b", None),
        ];
        for (raw, want) in cases {
            assert_eq!(h(raw).as_deref(), want, "{raw}");
        }
        assert_eq!(h(&"a".repeat(300)), None);
    }

    #[test]
    fn empty_labels_are_found() {
        for name in ["mixed.test.", "a..b", ".a", "a."] {
            assert!(has_empty_label(name.as_bytes()), "{name}");
        }
        for name in ["a", "a.b", "[::1]", "127.0.0.1"] {
            assert!(!has_empty_label(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn paths() {
        let cases = [
            ("/", "/"),
            ("/api/x", "/api/x"),
            ("/public/../admin", "/admin"),
            ("/a/./b/", "/a/b/"),
            ("/../../etc", "/etc"),
            ("/%61dmin", "/admin"),
            ("/%2e%2e/admin", "/admin"),
            ("/a%2fb", "/a%2Fb"),
            ("//a///b", "/a/b"),
            ("/a/..", "/"),
            ("/%", "/%"),
            ("/%4", "/%4"),
            ("/caf\u{e9}", "/caf%C3%A9"),
            ("/caf%c3%a9/x", "/caf%C3%A9/x"),
            ("/a b", "/a%20b"),
            ("/a\"{x}", "/a%22%7Bx%7D"),
        ];
        for (raw, want) in cases {
            assert_eq!(path(raw), want, "{raw}");
        }
        assert!(matches!(path("/clean/path"), Cow::Borrowed(_)));
    }

    #[test]
    fn segment_prefixes() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/"));
        assert!(prefix_matches("/api", "/api/x"));
        assert!(!prefix_matches("/api", "/apix"));
        assert!(prefix_matches("/api/", "/api/x"));
        assert!(!prefix_matches("/api/", "/api"));
    }
}
