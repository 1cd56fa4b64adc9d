//! A log line said at most once a period, with how many times the same thing happened
//! unsaid since: refused admin requests, a Kubernetes API server that cuts or refuses its
//! watches. A client or a server that repeats itself cannot flood the log, and nothing goes
//! unseen.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The words a due line ends with when `more` went unsaid before it: nothing for none, else
/// ` (N more since the last report)`.
pub fn more_words(more: u64) -> String {
    match more {
        0 => String::new(),
        n => format!(" ({n} more since the last report)"),
    }
}

/// What [`SaidEvery::note`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Said {
    /// A line is due, with how many went unsaid before it.
    Due(u64),
    /// Counted, the first since the last line: [`SaidEvery::unsaid_due`] a period on tells it.
    FirstUnsaid,
    /// Counted.
    Counted,
}

/// When the line was last said, and how many went unsaid since.
pub struct SaidEvery {
    period: Duration,
    last: Mutex<Option<(Instant, u64)>>,
}

impl SaidEvery {
    pub fn new(period: Duration) -> SaidEvery {
        SaidEvery {
            period,
            last: Mutex::new(None),
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// The thing happened at `now`: a line is due (with how many went unsaid before it), or
    /// the last was said less than a period ago and this one is counted.
    pub fn note(&self, now: Instant) -> Said {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let more = match &mut *last {
            Some((at, quiet)) if now.duration_since(*at) < self.period => {
                *quiet += 1;
                return match *quiet {
                    1 => Said::FirstUnsaid,
                    _ => Said::Counted,
                };
            }
            Some((_, quiet)) => *quiet,
            None => 0,
        };
        *last = Some((now, 0));
        Said::Due(more)
    }

    /// [`SaidEvery::note`] as how many went unsaid before it when a line is due.
    pub fn due(&self, now: Instant) -> Option<u64> {
        match self.note(now) {
            Said::Due(more) => Some(more),
            Said::FirstUnsaid | Said::Counted => None,
        }
    }

    /// What went unsaid since the last line, once a period has passed since it: to be said
    /// now (the count starts again). A burst that then goes quiet was told only with the next
    /// line, whenever that came.
    pub fn unsaid_due(&self, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *last {
            Some((at, quiet)) if *quiet > 0 && now.duration_since(*at) >= self.period => {
                let unsaid = *quiet;
                *last = Some((now, 0));
                Some(unsaid)
            }
            _ => None,
        }
    }

    /// [`SaidEvery::due`] as the words a due line ends with: nothing when none went unsaid,
    /// else ` (N more since the last report)`.
    pub fn due_note(&self, now: Instant) -> Option<String> {
        self.due(now).map(more_words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_a_period_then_the_count_of_the_rest() {
        let period = Duration::from_secs(1);
        let said = SaidEvery::new(period);
        assert_eq!(said.due(Instant::now()), Some(0), "the first is said");
        for _ in 0..5 {
            tokio::time::advance(Duration::from_millis(150)).await;
            assert_eq!(said.due(Instant::now()), None, "within the period: counted");
        }
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(
            said.due(Instant::now()),
            Some(5),
            "a period on: said, with the five"
        );
        assert_eq!(said.due(Instant::now()), None);
        tokio::time::advance(period).await;
        assert_eq!(said.due(Instant::now()), Some(1), "the count starts again");
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(said.due_note(Instant::now()), None);
        tokio::time::advance(period).await;
        let note = said.due_note(Instant::now());
        assert_eq!(note.as_deref(), Some(" (1 more since the last report)"));
    }

    /// A burst that goes quiet is told a period after its first line, and only once.
    #[tokio::test(start_paused = true)]
    async fn a_burst_that_goes_quiet_is_told_a_period_on() {
        let period = Duration::from_secs(1);
        let said = SaidEvery::new(period);
        assert_eq!(said.note(Instant::now()), Said::Due(0));
        assert_eq!(said.note(Instant::now()), Said::FirstUnsaid);
        assert_eq!(said.note(Instant::now()), Said::Counted);
        assert_eq!(said.unsaid_due(Instant::now()), None, "not a period on yet");
        tokio::time::advance(period).await;
        assert_eq!(said.unsaid_due(Instant::now()), Some(2));
        assert_eq!(said.unsaid_due(Instant::now()), None, "told once");
        assert_eq!(said.note(Instant::now()), Said::FirstUnsaid);
    }
}
