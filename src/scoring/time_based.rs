//! `time-based`: mula's current ranker. The priority is the work's creation time in seconds, so
//! older work goes first and anything a user pushes (priority 1) before all of it. It reads no
//! input that changes while the work waits, and does not age: nothing is ever re-scored.

use chrono::{DateTime, Utc};

use super::{AUTOMATIC_MIN, CalculateScore, Score, ScoreInput};

/// Older work first.
pub struct TimeBased;

impl CalculateScore for TimeBased {
    fn name(&self) -> &'static str {
        "time-based"
    }

    fn needs_history(&self) -> bool {
        false
    }

    fn score_at(&self, input: &ScoreInput, _at: DateTime<Utc>) -> Score {
        let created = input.now.timestamp();
        Score {
            priority: Some(created.max(AUTOMATIC_MIN)),
            ..Score::new()
        }
        .term("created_at_seconds", created)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone};

    #[test]
    fn older_work_ranks_first() {
        let t = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap();
        let old = ScoreInput::fresh(t, Duration::days(1));
        let new = ScoreInput::fresh(t + Duration::seconds(5), Duration::days(1));
        assert!(TimeBased.score(&old).priority < TimeBased.score(&new).priority);
    }
}
