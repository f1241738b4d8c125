//! Schedules: recurring work (mula's `Schedule`): a scheduler, an organisation, the task data to
//! run and when: a cron expression, or a deadline. Cron expressions follow Python croniter's
//! semantics in UTC, as mula evaluates them: five fields (minute, hour, day of month, month, day
//! of week), `L` for the last day of the month, names for months and weekdays, and a day that
//! matches day-of-month *or* day-of-week when both are restricted.

use std::fmt;

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde::Serialize;
use uuid::Uuid;

use super::SchedulerId;

/// A cron expression that cannot be used; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cron expression '{expression}': {reason}")]
pub struct CronError {
    /// The expression as given.
    pub expression: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A parsed cron expression.
#[derive(Clone)]
pub struct CronExpr {
    text: String,
    cron: Cron,
}

impl fmt::Debug for CronExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CronExpr({})", self.text)
    }
}

impl CronExpr {
    /// Parses a five-field expression (croniter's; no seconds or years field).
    pub fn parse(text: &str) -> Result<Self, CronError> {
        let bad = |reason: String| CronError {
            expression: text.to_owned(),
            reason,
        };
        let fields = text.split_whitespace().count();
        if fields != 5 && !text.trim_start().starts_with('@') {
            return Err(bad(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), got {fields}"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(text)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            text: text.to_owned(),
            cron,
        })
    }

    /// The expression as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The first time the expression fires strictly after `after` (croniter's `get_next`).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&after, false).ok()
    }
}

/// A schedule as the API shows it (mula's `Schedule`, plus why it was disabled, if the scheduler
/// did it).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Schedule {
    /// The schedule id.
    pub id: Uuid,
    /// `boefje`, `normalizer` or `report`.
    pub scheduler_id: SchedulerId,
    /// The organisation.
    pub organisation: String,
    /// The hash of `data` (the same as its tasks' hash); unique over all schedules.
    pub hash: String,
    /// The task data to run.
    #[schema(value_type = Object)]
    pub data: Box<serde_json::value::RawValue>,
    /// Whether it still runs.
    pub enabled: bool,
    /// A cron expression (UTC), if it recurs by one.
    pub schedule: Option<String>,
    /// When it is next due.
    pub deadline_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub modified_at: DateTime<Utc>,
    /// Why the scheduler disabled it (its plugin or object is gone, or no longer permitted).
    pub disabled_reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
    }

    #[test]
    fn next_fires_follow_croniter_in_utc() {
        let daily = CronExpr::parse("0 3 * * *").unwrap();
        assert_eq!(
            daily.next_after(at(2026, 11, 23, 2, 59)),
            Some(at(2026, 11, 23, 3, 0))
        );
        // Strictly after: a fire time itself gives the next one.
        assert_eq!(
            daily.next_after(at(2026, 11, 23, 3, 0)),
            Some(at(2026, 11, 24, 3, 0))
        );
        // `L`: the last day of the month (Rocky's monthly reports).
        let monthly = CronExpr::parse("0 0 L * *").unwrap();
        assert_eq!(
            monthly.next_after(at(2027, 2, 10, 0, 0)),
            Some(at(2027, 2, 28, 0, 0))
        );
        // Day-of-month or day-of-week when both are restricted (Vixie cron, croniter).
        let either = CronExpr::parse("0 0 1 * MON").unwrap();
        assert_eq!(
            either.next_after(at(2026, 11, 23, 12, 0)),
            Some(at(2026, 11, 30, 0, 0)),
            "Monday the 30th comes before the 1st"
        );
    }

    #[test]
    fn a_bad_expression_says_why() {
        for bad in ["", "* * *", "0 0 * * * *", "61 * * * *", "nonsense"] {
            let e = CronExpr::parse(bad).unwrap_err();
            assert!(e.to_string().contains("invalid cron expression"), "{bad}: {e}");
        }
        assert!(CronExpr::parse("@daily").is_ok());
    }
}
