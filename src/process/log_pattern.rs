//! `log_pattern` (Aralez 0.95, log4rs's syntax): formats app log events from the pieces the
//! config parsed (`config::log_conf::PatternPiece`). Dates are UTC.

use std::fmt;
use std::time::SystemTime;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::log_conf::{Padding, PatternPiece};
use crate::utc::UtcTime;

/// An event formatter for one parsed `log_pattern`.
pub struct PatternFormat {
    pieces: Vec<PatternPiece>,
    pid: u32,
}

impl PatternFormat {
    pub fn new(pieces: Vec<PatternPiece>) -> PatternFormat {
        PatternFormat {
            pieces,
            pid: std::process::id(),
        }
    }
}

impl<S, N> FormatEvent<S, N> for PatternFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let now = UtcTime::of(SystemTime::now());
        for piece in &self.pieces {
            match piece {
                PatternPiece::Text(text) => writer.write_str(text)?,
                PatternPiece::Date(None) => {
                    write_date(&mut writer, &now, "%Y-%m-%dT%H:%M:%S%.3fZ")?
                }
                PatternPiece::Date(Some(format)) => write_date(&mut writer, &now, format)?,
                PatternPiece::Level(pad) => padded(&mut writer, meta.level().as_str(), *pad)?,
                PatternPiece::Target(pad) => padded(&mut writer, meta.target(), *pad)?,
                PatternPiece::Thread(pad) => {
                    let thread = std::thread::current();
                    padded(&mut writer, thread.name().unwrap_or("-"), *pad)?
                }
                PatternPiece::Pid => write!(writer, "{}", self.pid)?,
                PatternPiece::Message => ctx.format_fields(writer.by_ref(), event)?,
                PatternPiece::Newline => writer.write_char('\n')?,
            }
        }
        Ok(())
    }
}

fn padded(w: &mut Writer<'_>, text: &str, pad: Padding) -> fmt::Result {
    match (pad.width, pad.right) {
        (0, _) => w.write_str(text),
        (width, false) => write!(w, "{text:<width$}"),
        (width, true) => write!(w, "{text:>width$}"),
    }
}

/// The strftime subset `config::log_conf` accepts.
fn write_date(w: &mut impl fmt::Write, t: &UtcTime, format: &str) -> fmt::Result {
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            w.write_char(c)?;
            continue;
        }
        let mut next = chars.next();
        let dot = next == Some('.');
        if dot {
            next = chars.next();
        }
        match next {
            Some('Y') => write!(w, "{:04}", t.year)?,
            Some('m') => write!(w, "{:02}", t.month)?,
            Some('d') => write!(w, "{:02}", t.day)?,
            Some('H') => write!(w, "{:02}", t.hour)?,
            Some('M') => write!(w, "{:02}", t.minute)?,
            Some('S') => write!(w, "{:02}", t.second)?,
            Some('F') => write!(w, "{:04}-{:02}-{:02}", t.year, t.month, t.day)?,
            Some('T') => write!(w, "{:02}:{:02}:{:02}", t.hour, t.minute, t.second)?,
            Some('z') => w.write_str("+0000")?,
            Some('%') => w.write_char('%')?,
            Some(digits @ ('3' | '6' | '9')) => {
                chars.next(); // the `f`, checked when the config was read
                if dot {
                    w.write_char('.')?;
                }
                match digits {
                    '3' => write!(w, "{:03}", t.nanos / 1_000_000)?,
                    '6' => write!(w, "{:06}", t.nanos / 1_000)?,
                    _ => write!(w, "{:09}", t.nanos)?,
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn dates_follow_the_format() {
        let t = UtcTime::of(UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789));
        let mut out = String::new();
        write_date(&mut out, &t, "%F %T%.3f %z %%|%Y%m%d%H%M%S.%6f").unwrap();
        assert_eq!(out, "2023-11-14 22:13:20.123 +0000 %|20231114221320.123456");
    }
}
