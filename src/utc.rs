//! Calendar time in UTC for log lines (the app log's `log_pattern` dates and the access log's
//! `time=`): a `SystemTime` broken into its fields, with no time zone database and no allocation.

use std::time::{SystemTime, UNIX_EPOCH};

/// A moment's UTC calendar fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UtcTime {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub nanos: u32,
    /// Whole seconds since the epoch (to reuse a formatted prefix within one second).
    pub epoch_second: u64,
}

impl UtcTime {
    pub fn of(time: SystemTime) -> UtcTime {
        let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs();
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (year, month, day) = civil_from_days(days as i64);
        UtcTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
            nanos: since.subsec_nanos(),
            epoch_second: secs,
        }
    }
}

/// `time` as RFC 3339 in UTC, to the second (`2026-11-25T17:54:00Z`).
pub fn rfc3339(time: SystemTime) -> String {
    let t = UtcTime::of(time);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_convert() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        let t = UtcTime::of(UNIX_EPOCH + Duration::new(19_782 * 86_400 + 3_723, 5_000_000));
        assert_eq!((t.hour, t.minute, t.second, t.nanos), (1, 2, 3, 5_000_000));
    }
}
