use super::Header;

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderName};
use http::method::Method;

const DEFAULT_MAX_ALLOWED_SIZE: usize = 4 * 1024;

#[derive(Debug)]
pub struct Encoder {
    /// Patched in by aralez: the dynamic table's maximum size in effect, the last one signalled
    /// (RFC 7541 §4.2). Nothing is ever inserted (see `encode`), but a peer that lowers
    /// SETTINGS_HEADER_TABLE_SIZE still gets the size update it waits for.
    table_size: usize,
    max_allowed_size: usize,
    size_update: Option<SizeUpdate>,
    /// Reusable buffer for the encoded header block of a single frame.
    ///
    /// A header block only has to live until it is copied into the
    /// connection write buffer, so the buffer that holds it can be reused
    /// across frames instead of being allocated and freed per frame. See
    /// `take_scratch` / `return_scratch`.
    scratch: BytesMut,
}

#[derive(Debug, Copy, Clone, Eq, PartialEq)]
enum SizeUpdate {
    One(usize),
    Two(usize, usize), // min, max
}

impl Encoder {
    pub fn new(max_size: usize) -> Encoder {
        let max_size = max_size.min(DEFAULT_MAX_ALLOWED_SIZE);

        Encoder {
            table_size: max_size,
            max_allowed_size: DEFAULT_MAX_ALLOWED_SIZE,
            size_update: None,
            scratch: BytesMut::new(),
        }
    }

    #[cfg(test)]
    fn set_max_allowed_size(&mut self, max: usize) {
        self.max_allowed_size = max;

        if self.table_size > max {
            self.update_max_size(max);
        }
    }

    /// Takes the reusable buffer for one header-block encode.
    ///
    /// The buffer is returned by `return_scratch` once the encoded block has
    /// been copied into the write buffer. If it is not returned - the
    /// CONTINUATION path keeps it, since the remainder is still needed - the
    /// next call simply starts from a fresh buffer.
    pub(crate) fn take_scratch(&mut self) -> BytesMut {
        std::mem::take(&mut self.scratch)
    }

    /// Returns a fully-written header block buffer for reuse.
    pub(crate) fn return_scratch(&mut self, scratch: BytesMut) {
        self.scratch = scratch;
    }

    /// Queues a max size update.
    ///
    /// The next call to `encode` will include a dynamic size update frame.
    pub fn update_max_size(&mut self, val: usize) {
        let val = val.min(self.max_allowed_size);

        match self.size_update {
            Some(SizeUpdate::One(old)) => {
                if val > old {
                    if old > self.table_size {
                        self.size_update = Some(SizeUpdate::One(val));
                    } else {
                        self.size_update = Some(SizeUpdate::Two(old, val));
                    }
                } else {
                    self.size_update = Some(SizeUpdate::One(val));
                }
            }
            Some(SizeUpdate::Two(min, _)) => {
                if val < min {
                    self.size_update = Some(SizeUpdate::One(val));
                } else {
                    self.size_update = Some(SizeUpdate::Two(min, val));
                }
            }
            None => {
                if val != self.table_size {
                    // Don't bother writing a frame if the value already matches
                    // the table's max size.
                    self.size_update = Some(SizeUpdate::One(val));
                }
            }
        }
    }

    /// Encode a set of headers into the provide buffer
    pub fn encode<I>(&mut self, headers: I, dst: &mut BytesMut)
    where
        I: IntoIterator<Item = Header<Option<HeaderName>>>,
    {
        let span = tracing::trace_span!("hpack::encode");
        let _e = span.enter();

        self.encode_size_updates(dst);

        // Patched in by aralez: every field is sent as a literal without indexing (never
        // indexed when its value is sensitive), its name by its static-table index where it
        // has one, its strings without Huffman coding; a field whose name and value are both
        // in the static table (`:status: 200`, `:method: GET`) is sent as that index. The last
        // field is kept with its name's index for the values that follow it under its name.
        let mut last: Option<(Header, Option<usize>)> = None;
        for header in headers {
            match header.reify() {
                Ok(header) => {
                    let name_index = match static_index(&header) {
                        Some((idx, true)) => {
                            encode_int(idx, 7, 0x80, dst);
                            Some(idx)
                        }
                        found => {
                            let name_index = found.map(|(idx, _)| idx);
                            let (value, sensitive) = (header.value_slice(), header.is_sensitive());
                            encode_literal(&header, name_index, value, sensitive, dst);
                            name_index
                        }
                    };
                    last = Some((header, name_index));
                }
                Err(value) => {
                    let (name, name_index) = last.as_ref().unwrap_or_else(|| {
                        panic!(
                            "encoding header without name, but no previous header to take it from"
                        );
                    });
                    let sensitive = value.is_sensitive();
                    encode_literal(name, *name_index, value.as_ref(), sensitive, dst);
                }
            }
        }
    }

    fn encode_size_updates(&mut self, dst: &mut BytesMut) {
        match self.size_update.take() {
            Some(SizeUpdate::One(val)) => {
                self.table_size = val;
                encode_size_update(val, dst);
            }
            Some(SizeUpdate::Two(min, max)) => {
                self.table_size = max;
                encode_size_update(min, dst);
                encode_size_update(max, dst);
            }
            None => {}
        }
    }
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder::new(4096)
    }
}

/// Patched in by aralez: `value` under `header`'s name as a literal without indexing (RFC 7541
/// §6.2.2; never indexed, §6.2.3, when `sensitive`): the name by its static-table index
/// (`name_index`) when it has one, else as a raw string.
fn encode_literal(
    header: &Header,
    name_index: Option<usize>,
    value: &[u8],
    sensitive: bool,
    dst: &mut BytesMut,
) {
    let first = if sensitive { 0b0001_0000 } else { 0 };
    match name_index {
        Some(idx) => encode_int(idx, 4, first, dst),
        None => {
            dst.put_u8(first);
            encode_raw_str(header.name().as_slice(), dst);
        }
    }
    encode_raw_str(value, dst);
}

/// Patched in by aralez: a string literal without Huffman coding (RFC 7541 §5.2, H = 0).
fn encode_raw_str(val: &[u8], dst: &mut BytesMut) {
    encode_int(val.len(), 7, 0, dst);
    dst.put_slice(val);
}

fn encode_size_update(val: usize, dst: &mut BytesMut) {
    encode_int(val, 5, 0b0010_0000, dst)
}

/// Encode an integer into the given destination buffer
fn encode_int<B: BufMut>(
    mut value: usize,   // The integer to encode
    prefix_bits: usize, // The number of bits in the prefix
    first_byte: u8,     // The base upon which to start encoding the int
    dst: &mut B,
) {
    if encode_int_one_byte(value, prefix_bits) {
        dst.put_u8(first_byte | value as u8);
        return;
    }

    let low = (1 << prefix_bits) - 1;

    value -= low;

    dst.put_u8(first_byte | low as u8);

    while value >= 128 {
        dst.put_u8(0b1000_0000 | value as u8);

        value >>= 7;
    }

    dst.put_u8(value as u8);
}

/// Returns true if the in the int can be fully encoded in the first byte.
fn encode_int_one_byte(value: usize, prefix_bits: usize) -> bool {
    value < (1 << prefix_bits) - 1
}

/// Patched in by aralez (moved here from `table.rs`, which held the dynamic table this encoder
/// no longer keeps): the header's index in the static table (RFC 7541 Appendix A), and whether
/// its value is the one there too.
fn static_index(header: &Header) -> Option<(usize, bool)> {
    match *header {
        Header::Field {
            ref name,
            ref value,
        } => match *name {
            header::ACCEPT_CHARSET => Some((15, false)),
            header::ACCEPT_ENCODING => {
                if value == "gzip, deflate" {
                    Some((16, true))
                } else {
                    Some((16, false))
                }
            }
            header::ACCEPT_LANGUAGE => Some((17, false)),
            header::ACCEPT_RANGES => Some((18, false)),
            header::ACCEPT => Some((19, false)),
            header::ACCESS_CONTROL_ALLOW_ORIGIN => Some((20, false)),
            header::AGE => Some((21, false)),
            header::ALLOW => Some((22, false)),
            header::AUTHORIZATION => Some((23, false)),
            header::CACHE_CONTROL => Some((24, false)),
            header::CONTENT_DISPOSITION => Some((25, false)),
            header::CONTENT_ENCODING => Some((26, false)),
            header::CONTENT_LANGUAGE => Some((27, false)),
            header::CONTENT_LENGTH => Some((28, false)),
            header::CONTENT_LOCATION => Some((29, false)),
            header::CONTENT_RANGE => Some((30, false)),
            header::CONTENT_TYPE => Some((31, false)),
            header::COOKIE => Some((32, false)),
            header::DATE => Some((33, false)),
            header::ETAG => Some((34, false)),
            header::EXPECT => Some((35, false)),
            header::EXPIRES => Some((36, false)),
            header::FROM => Some((37, false)),
            header::HOST => Some((38, false)),
            header::IF_MATCH => Some((39, false)),
            header::IF_MODIFIED_SINCE => Some((40, false)),
            header::IF_NONE_MATCH => Some((41, false)),
            header::IF_RANGE => Some((42, false)),
            header::IF_UNMODIFIED_SINCE => Some((43, false)),
            header::LAST_MODIFIED => Some((44, false)),
            header::LINK => Some((45, false)),
            header::LOCATION => Some((46, false)),
            header::MAX_FORWARDS => Some((47, false)),
            header::PROXY_AUTHENTICATE => Some((48, false)),
            header::PROXY_AUTHORIZATION => Some((49, false)),
            header::RANGE => Some((50, false)),
            header::REFERER => Some((51, false)),
            header::REFRESH => Some((52, false)),
            header::RETRY_AFTER => Some((53, false)),
            header::SERVER => Some((54, false)),
            header::SET_COOKIE => Some((55, false)),
            header::STRICT_TRANSPORT_SECURITY => Some((56, false)),
            header::TRANSFER_ENCODING => Some((57, false)),
            header::USER_AGENT => Some((58, false)),
            header::VARY => Some((59, false)),
            header::VIA => Some((60, false)),
            header::WWW_AUTHENTICATE => Some((61, false)),
            _ => None,
        },
        Header::Authority(_) => Some((1, false)),
        Header::Method(ref v) => match *v {
            Method::GET => Some((2, true)),
            Method::POST => Some((3, true)),
            _ => Some((2, false)),
        },
        Header::Scheme(ref v) => match &**v {
            "http" => Some((6, true)),
            "https" => Some((7, true)),
            _ => Some((6, false)),
        },
        Header::Path(ref v) => match &**v {
            "/" => Some((4, true)),
            "/index.html" => Some((5, true)),
            _ => Some((4, false)),
        },
        Header::Protocol(..) => None,
        Header::Status(ref v) => match u16::from(*v) {
            200 => Some((8, true)),
            204 => Some((9, true)),
            206 => Some((10, true)),
            304 => Some((11, true)),
            400 => Some((12, true)),
            404 => Some((13, true)),
            500 => Some((14, true)),
            _ => Some((8, false)),
        },
    }
}

#[cfg(test)]
mod test {
    // Patched in by aralez: the upstream tests checked the dynamic table this encoder no longer
    // keeps; these check what it sends instead.
    use super::*;
    use crate::hpack::Decoder;
    use http::*;

    fn encode(e: &mut Encoder, hdrs: Vec<Header<Option<HeaderName>>>) -> BytesMut {
        let mut dst = BytesMut::with_capacity(1024);
        e.encode(hdrs, &mut dst);
        dst
    }

    fn method(s: &str) -> Header<Option<HeaderName>> {
        Header::Method(Method::from_bytes(s.as_bytes()).unwrap())
    }

    fn header(name: &str, val: &str) -> Header<Option<HeaderName>> {
        Header::Field {
            name: Some(HeaderName::from_bytes(name.as_bytes()).unwrap()),
            value: HeaderValue::from_bytes(val.as_bytes()).unwrap(),
        }
    }

    #[test]
    fn a_name_and_value_both_in_the_static_table_are_its_index() {
        let mut encoder = Encoder::default();
        assert_eq!(*encode(&mut encoder, vec![method("GET")]), [0x80 | 2]);
        assert_eq!(*encode(&mut encoder, vec![method("POST")]), [0x80 | 3]);
        let status = Header::Status(StatusCode::OK);
        assert_eq!(*encode(&mut encoder, vec![status]), [0x80 | 8]);
    }

    #[test]
    fn a_static_name_with_another_value_is_a_literal_without_indexing_every_time() {
        let mut encoder = Encoder::default();
        for _ in 0..2 {
            let res = encode(&mut encoder, vec![method("PATCH")]);
            assert_eq!(*res, *b"\x02\x05PATCH");
            // content-language is static index 27: 15 in the 4-bit prefix, 12 after it.
            let res = encode(&mut encoder, vec![header("content-language", "foo")]);
            assert_eq!(*res, *b"\x0f\x0c\x03foo");
        }
    }

    #[test]
    fn a_name_outside_the_static_table_is_sent_as_a_raw_string() {
        let mut encoder = Encoder::default();
        let res = encode(&mut encoder, vec![header("foo", "hello")]);
        assert_eq!(*res, *b"\x00\x03foo\x05hello");
    }

    #[test]
    fn a_sensitive_value_is_never_indexed() {
        let mut encoder = Encoder::default();
        let mut value = HeaderValue::from_static("secret");
        value.set_sensitive(true);
        let name = Some(HeaderName::from_static("x-token"));
        let res = encode(&mut encoder, vec![Header::Field { name, value }]);
        assert_eq!(*res, *b"\x10\x07x-token\x06secret");
    }

    #[test]
    fn a_repeated_name_takes_the_previous_one() {
        let mut encoder = Encoder::default();
        let again = Header::Field {
            name: None,
            value: HeaderValue::from_static("b=2"),
        };
        let res = encode(&mut encoder, vec![header("set-cookie", "a=1"), again]);
        // set-cookie is static index 55: 15 in the 4-bit prefix, 40 after it.
        assert_eq!(*res, *b"\x0f\x28\x03a=1\x0f\x28\x03b=2");
    }

    #[test]
    fn a_long_value_has_a_multi_byte_length() {
        let mut encoder = Encoder::default();
        let long = "x".repeat(200);
        let res = encode(&mut encoder, vec![header("foo", &long)]);
        assert_eq!(res[..6], *b"\x00\x03foo\x7f");
        assert_eq!(res[6], 200 - 127);
        assert_eq!(res[7..], *long.as_bytes());
    }

    #[test]
    fn a_lowered_table_size_is_signalled_once() {
        let mut encoder = Encoder::default();
        encoder.update_max_size(0);
        assert_eq!(*encode(&mut encoder, vec![method("GET")]), [0x20, 0x82]);
        assert_eq!(*encode(&mut encoder, vec![method("GET")]), [0x82]);
    }

    #[test]
    fn what_it_sends_decodes_to_what_it_was_given() {
        let mut encoder = Encoder::default();
        let mut decoder = Decoder::new(4096);
        let sent = vec![
            Header::Status(StatusCode::NOT_FOUND),
            header("content-type", "text/html"),
            header("x-request-id", "0123456789abcdef"),
            header("server", &"s".repeat(300)),
        ];
        for _ in 0..2 {
            let mut block = encode(&mut encoder, sent.clone());
            let mut got = vec![];
            decoder
                .decode(&mut std::io::Cursor::new(&mut block), |h| {
                    got.push(h);
                    std::ops::ControlFlow::Continue(())
                })
                .unwrap();
            let want: Vec<Header> = sent.iter().map(|h| h.clone().reify().unwrap()).collect();
            assert_eq!(got, want);
        }
    }
}
