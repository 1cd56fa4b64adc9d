//! Whether a DNS-01 record is visible yet: a TXT query (RFC 1035) over UDP to `dns_resolver`
//! (else the first `nameserver` of /etc/resolv.conf), asked every two seconds until every
//! published value is in the answer or the wait is over. Answers are checked against the
//! query's id and name, and read within a 4 KiB bound; a truncated answer counts as not yet.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::UdpSocket;

/// One query's deadline.
const QUERY_DEADLINE: Duration = Duration::from_secs(2);
const ASK_EVERY: Duration = Duration::from_secs(2);
const TXT: u16 = 16;
const IN: u16 = 1;

/// The first `nameserver` of /etc/resolv.conf, on port 53.
pub fn system_resolver() -> Option<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("nameserver"))
            .then(|| words.next()?.parse::<std::net::IpAddr>().ok())
            .flatten()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

/// Waits until `resolver` answers every one of `values` for `name`'s TXT records, for at most
/// `within`.
pub async fn wait_visible(
    resolver: SocketAddr,
    name: &str,
    values: &[String],
    within: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let last = match txt_values(resolver, name).await {
            Ok(seen) if values.iter().all(|v| seen.contains(v)) => return Ok(()),
            Ok(seen) => format!("{} of {} values seen", seen.len(), values.len()),
            Err(e) => e,
        };
        if tokio::time::Instant::now() + ASK_EVERY > deadline {
            return Err(format!(
                "the TXT record {name} is not visible at {resolver} within {within:?} ({last})"
            ));
        }
        tokio::time::sleep(ASK_EVERY).await;
    }
}

/// The TXT values `resolver` answers for `name`.
pub async fn txt_values(resolver: SocketAddr, name: &str) -> Result<Vec<String>, String> {
    let local: SocketAddr = if resolver.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await.map_err(|e| e.to_string())?;
    socket.connect(resolver).await.map_err(|e| e.to_string())?;
    let id = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        & 0xffff) as u16;
    let query = query(id, name)?;
    socket.send(&query).await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4096];
    let answer = async {
        loop {
            let n = socket.recv(&mut buf).await.map_err(|e| e.to_string())?;
            // A datagram of another query (or a stray one) is not ours: wait for ours.
            if n >= 2 && buf[..2] == id.to_be_bytes() {
                return parse_txt(&buf[..n], &query[12..]);
            }
        }
    };
    match tokio::time::timeout(QUERY_DEADLINE, answer).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "{resolver} did not answer within {QUERY_DEADLINE:?}"
        )),
    }
}

/// A recursive query for `name`'s TXT records.
fn query(id: u16, name: &str) -> Result<Vec<u8>, String> {
    let mut q = Vec::with_capacity(name.len() + 18);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("`{name}` is not a DNS name"));
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&TXT.to_be_bytes());
    q.extend_from_slice(&IN.to_be_bytes());
    Ok(q)
}

/// The TXT strings of an answer to `question` (the question section as sent).
fn parse_txt(msg: &[u8], question: &[u8]) -> Result<Vec<String>, String> {
    let short = || "a short DNS answer".to_string();
    if msg.len() < 12 {
        return Err(short());
    }
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    if flags & 0x0200 != 0 {
        return Err("a truncated DNS answer".into());
    }
    match flags & 0x000f {
        0 => {}
        3 => return Ok(Vec::new()), // NXDOMAIN: not there yet
        rcode => return Err(format!("DNS answer code {rcode}")),
    }
    let count = |at: usize| -> Result<usize, String> {
        let b = msg.get(at..at + 2).ok_or_else(short)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    };
    let (questions, answers) = (count(4)?, count(6)?);
    if questions != 1
        || msg
            .get(12..12 + question.len())
            .map(|q| q.eq_ignore_ascii_case(question))
            != Some(true)
    {
        return Err("a DNS answer to another question".into());
    }
    let mut at = 12 + question.len();
    let mut values = Vec::new();
    for _ in 0..answers {
        at = skip_name(msg, at).ok_or_else(short)?;
        let fixed = msg.get(at..at + 10).ok_or_else(short)?;
        let kind = u16::from_be_bytes([fixed[0], fixed[1]]);
        let len = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        let data = msg.get(at + 10..at + 10 + len).ok_or_else(short)?;
        at += 10 + len;
        if kind == TXT {
            values.push(txt_strings(data).ok_or_else(short)?);
        }
    }
    Ok(values)
}

/// Past a (possibly compressed) name at `at`.
fn skip_name(msg: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *msg.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return Some(at + 2),
            l => at += 1 + usize::from(l),
        }
    }
}

/// A TXT record's character-strings, joined (a long value is split into 255-byte strings).
fn txt_strings(mut data: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(data.len());
    while let Some((&len, rest)) = data.split_first() {
        let len = usize::from(len);
        out.extend_from_slice(rest.get(..len)?);
        data = &rest[len..];
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as a resolver sends it: the question, then two TXT records named by a
    /// compression pointer to it, one split into two strings.
    #[test]
    fn reads_txt_answers() {
        let q = query(0x1234, "_acme-challenge.a.test").expect("query");
        let mut msg = q.clone();
        msg[2..4].copy_from_slice(&[0x81, 0x80]);
        msg[6..8].copy_from_slice(&[0, 2]);
        for strings in [&["abc"][..], &["de", "f"][..]] {
            let data: Vec<u8> = strings
                .iter()
                .flat_map(|s| std::iter::once(s.len() as u8).chain(s.bytes()))
                .collect();
            msg.extend_from_slice(&[0xc0, 12, 0, 16, 0, 1, 0, 0, 0, 60]);
            msg.extend_from_slice(&(data.len() as u16).to_be_bytes());
            msg.extend_from_slice(&data);
        }
        assert_eq!(
            parse_txt(&msg, &q[12..]),
            Ok(vec!["abc".to_string(), "def".to_string()])
        );
        let mut nx = q.clone();
        nx[2..4].copy_from_slice(&[0x81, 0x83]);
        assert_eq!(parse_txt(&nx, &q[12..]), Ok(vec![]));
        let other = query(0x1234, "other.test").expect("query");
        assert!(parse_txt(&msg, &other[12..]).is_err());
        assert!(parse_txt(&msg[..msg.len() - 3], &q[12..]).is_err());
        assert!(query(1, "a..b").is_err());
    }
}
