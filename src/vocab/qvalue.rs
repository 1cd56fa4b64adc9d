//! Quality values (RFC 9110 §12.4.2), read one way for every use: the coding compression
//! picks and the `Accept-Encoding` variants the cache tells apart must agree on what a client
//! refused (a `q=0.0001` the one took for a refusal and the other for an acceptance put an
//! uncompressed answer where browsers' compressed one belonged).

/// The `q` parameter among `params` in thousandths (1000 when absent); `None` when malformed.
pub fn quality<'a>(params: impl Iterator<Item = &'a str>) -> Option<u16> {
    let mut q = 1000;
    for param in params {
        let Some((key, value)) = param.split_once('=') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("q") {
            q = parse_q(value.trim())?;
        }
    }
    Some(q)
}

/// `0`, `0.5`, `1.000`: at most three decimals, at most 1.
fn parse_q(text: &str) -> Option<u16> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u16 = match whole {
        "0" => 0,
        "1" => 1000,
        _ => return None,
    };
    let mut thousandths = 0u16;
    for (i, digit) in frac.bytes().enumerate() {
        thousandths += u16::from(digit - b'0') * [100, 10, 1][i];
    }
    let q = whole + thousandths;
    (q <= 1000).then_some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_decimals_at_most_and_at_most_one() {
        let q = |params: &str| quality(params.split(';').skip(1));
        assert_eq!(q("gzip"), Some(1000));
        assert_eq!(q("gzip;q=0.5"), Some(500));
        assert_eq!(q("gzip; Q=0"), Some(0));
        assert_eq!(q("gzip;q=1.000"), Some(1000));
        for malformed in [
            "gzip;q=0.0001",
            "gzip;q=0x",
            "gzip;q=-0",
            "gzip;q=1e-9",
            "gzip;q=\"0\"",
            "gzip;q=1.5",
        ] {
            assert_eq!(q(malformed), None, "{malformed}");
        }
    }
}
