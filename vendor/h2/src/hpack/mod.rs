mod decoder;
mod encoder;
pub(crate) mod header;
pub(crate) mod huffman;
// Patched in by aralez: no `table` module; the encoder keeps no dynamic table (encoder.rs).

#[cfg(test)]
mod test;

pub use self::decoder::{Decoder, DecoderError, NeedMore};
pub use self::encoder::Encoder;
pub use self::header::{BytesStr, Header};
