//! `change-delta`: work on objects whose findings changed, or whose last run failed, comes
//! sooner; a higher scan level (the organisation declared the object more important) sooner
//! still. Work that never ran comes first of all automatic work.
//!
//! Priority = [`BASE`] − [`CHANGED`] (findings changed) − [`FAILED`] (last run failed) −
//! [`PER_LEVEL`] × scan level, at least 3; never ran → 2.
//!
//! It reads nothing that moves with time, so a waiting task's priority changes only when an
//! event changes its inputs: its object's scan level or findings (the planner re-scores the
//! object's waiting tasks then, see `planner/rescore.rs`).

use chrono::{DateTime, Utc};

use super::{CalculateScore, Score, ScoreInput};

/// Work with no reason to hurry.
pub const BASE: i64 = 1000;
/// Sooner when the object's findings changed.
pub const CHANGED: i64 = 500;
/// Sooner when the last run failed.
pub const FAILED: i64 = 300;
/// Sooner per scan level.
pub const PER_LEVEL: i64 = 40;

/// Changed and failed work sooner, weighted by scan level.
pub struct ChangeDelta;

impl CalculateScore for ChangeDelta {
    fn name(&self) -> &'static str {
        "change-delta"
    }

    fn score_at(&self, input: &ScoreInput, _at: DateTime<Utc>) -> Score {
        if input.last_run.is_none() {
            return Score {
                priority: Some(2),
                ..Score::new()
            }
            .term("never_ran", true);
        }
        let mut p = BASE;
        let mut s = Score::new().term("base", BASE);
        if input.findings_changed {
            p -= CHANGED;
            s = s.term("findings_changed", -CHANGED);
        }
        if input.last_failed {
            p -= FAILED;
            s = s.term("last_failed", -FAILED);
        }
        let level = input.scan_level.unwrap_or(0).clamp(0, 4);
        p -= PER_LEVEL * level;
        s = s.term("scan_level", -PER_LEVEL * level);
        Score {
            priority: Some(p.max(3)),
            ..s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone};

    fn input(changed: bool, failed: bool, level: i64) -> ScoreInput {
        let now = Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap();
        ScoreInput {
            last_run: Some(now - Duration::days(2)),
            last_failed: failed,
            findings_changed: changed,
            scan_level: Some(level),
            ..ScoreInput::fresh(now, Duration::days(1))
        }
    }

    #[test]
    fn changed_and_failed_work_comes_sooner_and_a_higher_level_sooner_still() {
        let p = |c, f, l| ChangeDelta.score(&input(c, f, l)).priority.unwrap();
        assert!(p(true, false, 1) < p(false, false, 1));
        assert!(p(false, true, 1) < p(false, false, 1));
        assert!(p(true, true, 1) < p(true, false, 1));
        assert!(p(false, false, 4) < p(false, false, 1));
        let s = ChangeDelta.score(&input(true, true, 2));
        assert_eq!(s.terms["findings_changed"], -CHANGED);
        assert_eq!(s.terms["last_failed"], -FAILED);
    }
}
