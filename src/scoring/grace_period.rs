//! `grace-period`: mula's 2024 ranker, without its bug (it took only the seconds-within-a-day of
//! the age, so real priorities stayed within 857–1000 and "inside the grace period" never held).
//!
//! - never ran → [`NEVER_RAN`] (right after user scans);
//! - ran less than the grace period ago → not scheduled (`None`);
//! - otherwise `3 + 997 · (1 − overdue / 7 days)`, at least 3: the longer overdue, the sooner.

use chrono::Duration;

use super::{CalculateScore, Score, ScoreInput};

/// Work that never ran.
pub const NEVER_RAN: i64 = 2;
/// The most urgent overdue work.
const FLOOR: i64 = 3;
/// The span over which overdue work climbs from 1000 to [`FLOOR`].
const HORIZON_DAYS: i64 = 7;

/// Never run first; within the grace period not at all; then by how long overdue.
pub struct GracePeriod;

impl CalculateScore for GracePeriod {
    fn name(&self) -> &'static str {
        "grace-period"
    }

    fn depends_on_time(&self) -> bool {
        // The longer overdue, the sooner: the same work climbs as it waits.
        true
    }

    fn score(&self, input: &ScoreInput) -> Score {
        let Some(last) = input.last_run else {
            return Score {
                priority: Some(NEVER_RAN),
                ..Score::new()
            }
            .term("never_ran", true);
        };
        let since = input.now - last;
        let grace = Duration::seconds(input.grace_secs);
        let s = Score::new()
            .term("seconds_since_last_run", since.num_seconds())
            .term("grace_seconds", input.grace_secs);
        if since < grace {
            return s.term("inside_grace_period", true);
        }
        let overdue = (since - grace).num_seconds() as f64;
        let horizon = Duration::days(HORIZON_DAYS).num_seconds() as f64;
        let p = (FLOOR as f64 + 997.0 * (1.0 - overdue / horizon)).round() as i64;
        Score {
            priority: Some(p.clamp(FLOOR, 1000)),
            ..s
        }
        .term("seconds_overdue", overdue as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn input(ago: Option<Duration>) -> ScoreInput {
        let now = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap();
        ScoreInput {
            last_run: ago.map(|a| now - a),
            ..ScoreInput::fresh(now, Duration::days(1))
        }
    }

    #[test]
    fn never_run_first_then_by_how_long_overdue_and_nothing_inside_the_grace_period() {
        let never = GracePeriod.score(&input(None)).priority.unwrap();
        let week = GracePeriod
            .score(&input(Some(Duration::days(8))))
            .priority
            .unwrap();
        let two_days = GracePeriod
            .score(&input(Some(Duration::days(2))))
            .priority
            .unwrap();
        let just = GracePeriod
            .score(&input(Some(Duration::hours(25))))
            .priority
            .unwrap();
        assert!(
            never < week && week < two_days && two_days < just,
            "{never} {week} {two_days} {just}"
        );
        assert_eq!(week, FLOOR, "a week overdue is as urgent as it gets");
        assert_eq!(
            GracePeriod
                .score(&input(Some(Duration::hours(23))))
                .priority,
            None
        );
    }
}
