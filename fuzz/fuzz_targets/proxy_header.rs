//! The PROXY protocol header parser on arbitrary first bytes of a connection. Nothing panics; a
//! complete header never claims more bytes than it was given or than the format allows, and
//! parses the same from exactly its own bytes (so what follows it is never needed, never taken);
//! an incomplete one is a true prefix: shorter than the longest header, and a complete header's
//! prefixes are all incomplete (the reader takes the bytes of an incomplete one).
#![no_main]

use aralez::server::proxy_protocol::{parse, Parsed, V1_MAX, V2_MAX_PAYLOAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Parsed::Complete { header, len }) => {
            assert!(len <= data.len(), "claims {len} of {} bytes", data.len());
            let max = if data.starts_with(b"PROXY ") {
                V1_MAX
            } else {
                16 + V2_MAX_PAYLOAD
            };
            assert!(len <= max, "{len} bytes");
            assert_eq!(
                parse(&data[..len]),
                Ok(Parsed::Complete { header, len }),
                "the header alone parses differently"
            );
            // The reader consumes whatever is Incomplete: every proper prefix must be.
            if len > 0 {
                assert_eq!(
                    parse(&data[..len - 1]),
                    Ok(Parsed::Incomplete),
                    "a prefix of a header"
                );
            }
        }
        Ok(Parsed::Incomplete) => {
            assert!(
                data.len() < 16 + V2_MAX_PAYLOAD,
                "{} bytes still incomplete",
                data.len()
            );
            if let Some(shorter) = data.len().checked_sub(1) {
                assert_eq!(parse(&data[..shorter]), Ok(Parsed::Incomplete));
            }
        }
        Err(_) => {}
    }
});
