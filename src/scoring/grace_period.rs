//! `grace-period`: mula's 2024 ranker, without its bug (it took only the seconds-within-a-day of
//! the age, so real priorities stayed within 857–1000 and "inside the grace period" never held),
//! and with a priority that does not age.
//!
//! - never ran → [`NEVER_RAN`] (right after user scans);
//! - ran less than the grace period ago → not scheduled (`None`);
//! - otherwise the moment the work became due (`last_run + grace`) in Unix seconds: the longer
//!   overdue, the sooner.
//!
//! **Why the due moment.** mula's number, `3 + 997 · (1 − overdue / 7 days)` with `overdue = now −
//! due`, falls at the same rate for every waiting task, so at any instant it orders them as their
//! due moments do; the due moment orders them so at every instant without being rewritten as
//! time passes. Exactly (checked by the property tests in `scoring/mod.rs`): whenever mula's
//! number at some instant puts one task strictly before another, the due moment does too, or
//! ties (two due moments within the same second); it never puts them the other way round. Where
//! mula's number ties, the due moment decides: its clamps (everything overdue by more than 7 days
//! was 3, everything overdue by less than about 5 minutes 1000) and its steps of about 10 minutes
//! held tasks level that are not; now the one overdue longer goes first. Tasks due in the same
//! second tie, as any equal priorities do: older creation first, then task id.
//!
//! **What the API shows.** `priority` is that number, e.g. `1798848000` for work due at
//! 2027-01-01T00:00:00Z, like `time-based`'s creation moment (mula's own ranker). Every such
//! number is above [`NEVER_RAN`] (a due moment before 1970 counts as [`FLOOR`]), so user scans (1)
//! still go first and work that never ran next (2). mula's number is in the explanation as the
//! term `overdue_score`, with `seconds_overdue`, computed when asked.

use chrono::{DateTime, Duration, Utc};

use super::{CalculateScore, Score, ScoreInput};

/// Work that never ran.
pub const NEVER_RAN: i64 = 2;
/// The lowest priority of work that ran: a due moment before it counts as this.
pub const FLOOR: i64 = 3;
/// mula's number: the span over which overdue work climbs from 1000 to [`FLOOR`].
const HORIZON_DAYS: i64 = 7;

/// Never run first; within the grace period not at all; then by the moment it became due.
pub struct GracePeriod;

/// mula's 2024 number for work `overdue` seconds past its due moment: `3 + 997 · (1 − overdue /
/// 7 days)`, within 3–1000. It orders waiting work as its due moment does (ties aside), and is
/// shown in explanations only.
pub fn overdue_score(overdue_secs: i64) -> i64 {
    let horizon = Duration::days(HORIZON_DAYS).num_seconds() as f64;
    let p = (FLOOR as f64 + 997.0 * (1.0 - overdue_secs as f64 / horizon)).round() as i64;
    p.clamp(FLOOR, 1000)
}

/// The priority of work due at `due`: the moment in Unix seconds, at least [`FLOOR`].
pub fn due_priority(due: DateTime<Utc>) -> i64 {
    due.timestamp().max(FLOOR)
}

impl CalculateScore for GracePeriod {
    fn name(&self) -> &'static str {
        "grace-period"
    }

    fn score_at(&self, input: &ScoreInput, at: DateTime<Utc>) -> Score {
        let Some(last) = input.last_run else {
            return Score {
                priority: Some(NEVER_RAN),
                ..Score::new()
            }
            .term("never_ran", true);
        };
        let since = at - last;
        let grace = Duration::seconds(input.grace_secs);
        let due = last + grace;
        let s = Score::new()
            .term("seconds_since_last_run", since.num_seconds())
            .term("grace_seconds", input.grace_secs);
        if since < grace {
            return s.term("inside_grace_period", true);
        }
        let overdue = (since - grace).num_seconds();
        Score {
            priority: Some(due_priority(due)),
            ..s
        }
        .term("due_at", due.to_rfc3339())
        .term("seconds_overdue", overdue)
        .term("overdue_score", overdue_score(overdue))
        .term("as_of", at.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap()
    }

    fn input(ago: Option<Duration>) -> ScoreInput {
        ScoreInput {
            last_run: ago.map(|a| now() - a),
            ..ScoreInput::fresh(now(), Duration::days(1))
        }
    }

    #[test]
    fn never_run_first_then_by_how_long_overdue_and_nothing_inside_the_grace_period() {
        let p = |ago| GracePeriod.score(&input(ago)).priority;
        let never = p(None).unwrap();
        let week = p(Some(Duration::days(8))).unwrap();
        let two_days = p(Some(Duration::days(2))).unwrap();
        let just = p(Some(Duration::hours(25))).unwrap();
        assert!(
            never < week && week < two_days && two_days < just,
            "{never} {week} {two_days} {just}"
        );
        assert_eq!(
            week,
            (now() - Duration::days(7)).timestamp(),
            "the moment it became due, in Unix seconds"
        );
        assert_eq!(p(Some(Duration::hours(23))), None);
    }

    #[test]
    fn the_priority_stays_while_the_terms_move_with_the_time_asked() {
        let i = input(Some(Duration::days(2)));
        let planned = GracePeriod.score(&i);
        let later = GracePeriod.score_at(&i, now() + Duration::days(3));
        assert_eq!(planned.priority, later.priority, "priorities do not age");
        assert_eq!(planned.terms["seconds_overdue"], 86_400);
        assert_eq!(later.terms["seconds_overdue"], 4 * 86_400);
        assert_eq!(planned.terms["overdue_score"], overdue_score(86_400));
        assert_eq!(later.terms["overdue_score"], overdue_score(4 * 86_400));
        assert_eq!(
            later.terms["as_of"],
            (now() + Duration::days(3)).to_rfc3339()
        );
    }

    #[test]
    fn mulas_number_keeps_its_clamps() {
        assert_eq!(overdue_score(0), 1000);
        assert_eq!(overdue_score(8 * 86_400), FLOOR);
        assert_eq!(
            overdue_score(3_600),
            3 + (997.0_f64 * (1.0 - 3_600.0 / 604_800.0)).round() as i64
        );
    }

    #[test]
    fn a_due_moment_before_1970_is_still_after_work_that_never_ran() {
        let long_ago = Utc.with_ymd_and_hms(1960, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(due_priority(long_ago), FLOOR);
        assert!(due_priority(long_ago) > NEVER_RAN);
    }
}
