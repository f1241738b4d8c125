//! `time-based`: mula's current ranker. The priority is the work's creation time in seconds, so
//! older work goes first and anything a user pushes (priority 1) before all of it.

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

    fn score(&self, input: &ScoreInput) -> Score {
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
    use chrono::{Duration, TimeZone, Utc};

    #[test]
    fn older_work_ranks_first() {
        let t = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap();
        let old = ScoreInput::fresh(t, Duration::days(1));
        let new = ScoreInput::fresh(t + Duration::seconds(5), Duration::days(1));
        assert!(TimeBased.score(&old).priority < TimeBased.score(&new).priority);
    }
}
