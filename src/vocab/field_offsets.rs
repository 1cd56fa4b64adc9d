//! Where the fields of a head parsed by `httparse` lie in its bytes: kept as offsets while the
//! parser's borrow of the read buffer ends, so that the head can be split off the buffer and
//! each value made a slice of it. Shared by the server's request head and the inline client's
//! response head.

/// Where one field's name and value lie: `(start, end)` byte offsets into the head.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct FieldAt {
    pub name: (u32, u32),
    pub value: (u32, u32),
}

/// Heads with up to this many fields (nearly all) are noted without allocating.
const ON_STACK: usize = 24;

/// The offsets of a head's fields, in order: on the stack up to `ON_STACK` (24) fields, in an
/// array a quarter the size of one for the parsers' most fields (zeroing that one cost about 60
/// instructions a head; this one, about 40).
pub struct FieldOffsets {
    few: [FieldAt; ON_STACK],
    many: Vec<FieldAt>,
    len: usize,
}

impl FieldOffsets {
    pub fn new() -> FieldOffsets {
        FieldOffsets {
            few: [FieldAt::default(); ON_STACK],
            many: Vec::new(),
            len: 0,
        }
    }

    /// Notes where each of `fields` lies in `head`, the bytes they were parsed from.
    pub fn note(&mut self, head: &[u8], fields: &[httparse::Header<'_>]) {
        let base = head.as_ptr() as usize;
        let offset = |s: &[u8]| {
            let start = s.as_ptr() as usize - base;
            (start as u32, (start + s.len()) as u32)
        };
        let at = |field: &httparse::Header<'_>| FieldAt {
            name: offset(field.name.as_bytes()),
            value: offset(field.value),
        };
        self.len = fields.len();
        if fields.len() <= ON_STACK {
            for (slot, field) in self.few.iter_mut().zip(fields) {
                *slot = at(field);
            }
        } else {
            self.many = fields.iter().map(at).collect();
        }
    }

    pub fn as_slice(&self) -> &[FieldAt] {
        if self.len <= ON_STACK {
            &self.few[..self.len]
        } else {
            &self.many
        }
    }
}

impl Default for FieldOffsets {
    fn default() -> Self {
        FieldOffsets::new()
    }
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use super::*;

    fn offsets_of(head: &[u8]) -> (Vec<(String, String)>, usize) {
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; 100];
        let mut req = httparse::Request::new(&mut []);
        let parsed = httparse::ParserConfig::default()
            .parse_request_with_uninit_headers(&mut req, head, &mut fields)
            .expect("a valid head");
        assert!(parsed.is_complete());
        let mut offsets = FieldOffsets::new();
        offsets.note(head, req.headers);
        let text = |(s, e): (u32, u32)| {
            String::from_utf8(head[s as usize..e as usize].to_vec()).expect("ASCII")
        };
        let named = offsets
            .as_slice()
            .iter()
            .map(|f| (text(f.name), text(f.value)))
            .collect();
        (named, req.headers.len())
    }

    /// Heads with few fields and with more than fit on the stack give every field, in order.
    #[test]
    fn every_field_is_noted_in_order_on_the_stack_or_not() {
        for count in [0, 1, ON_STACK, ON_STACK + 1, 99] {
            let mut head = b"GET / HTTP/1.1\r\n".to_vec();
            for i in 0..count {
                head.extend_from_slice(format!("X-F{i}: v{i}\r\n").as_bytes());
            }
            head.extend_from_slice(b"\r\n");
            let (named, parsed) = offsets_of(&head);
            assert_eq!(parsed, count);
            let want: Vec<_> = (0..count)
                .map(|i| (format!("X-F{i}"), format!("v{i}")))
                .collect();
            assert_eq!(named, want, "{count} fields");
        }
    }
}
