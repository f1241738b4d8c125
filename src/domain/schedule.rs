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

/// The cron expressions the API takes: five fields, each `*`, `*/step` or a list of numbers in
/// the field's range; the day of month may also be `L`. A narrower language than croniter's
/// (no ranges, names or aliases), stated in the API document, so that every expression the
/// document allows is one the service runs; Rocky's schedules (daily, weekly, monthly on a day
/// or the last day, yearly) all fit it.
pub const CRON_PATTERN: &str = concat!(
    r"^\s*",
    r"(\*(/([1-9]|[1-5][0-9]))?|[0-5]?[0-9](,[0-5]?[0-9])*)\s+",
    r"(\*(/([1-9]|1[0-9]|2[0-3]))?|([01]?[0-9]|2[0-3])(,([01]?[0-9]|2[0-3]))*)\s+",
    r"(\*(/([1-9]|[12][0-9]|3[01]))?|L|([1-9]|[12][0-9]|3[01])(,([1-9]|[12][0-9]|3[01]))*)\s+",
    r"(\*(/([1-9]|1[0-2]))?|([1-9]|1[0-2])(,([1-9]|1[0-2]))*)\s+",
    r"(\*(/[1-7])?|[0-7](,[0-7])*)",
    r"\s*$"
);

/// One field of the API's cron grammar ([`CRON_PATTERN`]).
struct Field {
    name: &'static str,
    /// Values allowed.
    values: std::ops::RangeInclusive<u32>,
    /// Steps allowed after `*/`.
    steps: std::ops::RangeInclusive<u32>,
    /// Digits a value may have at most.
    digits: usize,
    /// Whether a value may start with 0 (`05`).
    leading_zero: bool,
    /// Whether `L` is allowed (day of month).
    last: bool,
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        values: 0..=59,
        steps: 1..=59,
        digits: 2,
        leading_zero: true,
        last: false,
    },
    Field {
        name: "hour",
        values: 0..=23,
        steps: 1..=23,
        digits: 2,
        leading_zero: true,
        last: false,
    },
    Field {
        name: "day of month",
        values: 1..=31,
        steps: 1..=31,
        digits: 2,
        leading_zero: false,
        last: true,
    },
    Field {
        name: "month",
        values: 1..=12,
        steps: 1..=12,
        digits: 2,
        leading_zero: false,
        last: false,
    },
    Field {
        name: "day of week",
        values: 0..=7,
        steps: 1..=7,
        digits: 1,
        leading_zero: false,
        last: false,
    },
];

fn number(text: &str, digits: usize, leading_zero: bool) -> Option<u32> {
    let ok = !text.is_empty()
        && text.len() <= digits
        && text.bytes().all(|b| b.is_ascii_digit())
        && (leading_zero || text == "0" || !text.starts_with('0'));
    ok.then(|| text.parse().ok()).flatten()
}

/// Checks `text` against [`CRON_PATTERN`]; the error names the field that does not fit.
fn fits_grammar(text: &str) -> Result<(), String> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected 5 fields (minute hour day-of-month month day-of-week), got {}",
            fields.len()
        ));
    }
    for (f, field) in FIELDS.iter().zip(&fields) {
        let ok = if let Some(step) = field.strip_prefix("*/") {
            number(step, 2, false).is_some_and(|s| f.steps.contains(&s))
        } else if *field == "*" || (f.last && *field == "L") {
            true
        } else {
            field
                .split(',')
                .all(|v| number(v, f.digits, f.leading_zero).is_some_and(|n| f.values.contains(&n)))
        };
        if !ok {
            return Err(format!(
                "{} '{field}': use '*', '*/step' or a list of numbers from {} to {}{}",
                f.name,
                f.values.start(),
                f.values.end(),
                if f.last { ", or L" } else { "" }
            ));
        }
    }
    Ok(())
}

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
        fits_grammar(text).map_err(bad)?;
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

/// When a schedule is next due after it fired at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// Wait of a boefje schedule whose plugin names no interval (mula's grace period).
    pub grace: std::time::Duration,
    /// Up to this much more, spread over schedules by their key.
    pub jitter: std::time::Duration,
}

impl Cadence {
    /// The next deadline: the next fire of `cron` if there is one; else `now` + `wait` (a
    /// plugin's interval, or the grace period when `wait` is `Some(None)`) + the key's spread;
    /// `None` when there is neither cron nor wait (a one-off that ran).
    pub fn next(
        &self,
        key: &str,
        cron: Option<&str>,
        wait: Option<Option<chrono::Duration>>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        if let Some(c) = cron.and_then(|c| CronExpr::parse(c).ok()) {
            return c.next_after(now);
        }
        let wait = wait?.unwrap_or_else(|| {
            chrono::Duration::from_std(self.grace).unwrap_or(chrono::Duration::days(1))
        });
        Some(now + wait + self.spread(key))
    }

    /// A key's share of the jitter: the same key, the same share.
    fn spread(&self, key: &str) -> chrono::Duration {
        let secs = self.jitter.as_secs();
        if secs == 0 {
            return chrono::Duration::zero();
        }
        let h = super::hash::task_hash(key);
        let n = u64::from_str_radix(&h[..16], 16).unwrap_or(0) % secs;
        chrono::Duration::seconds(i64::try_from(n).unwrap_or(0))
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
        let either = CronExpr::parse("0 0 1 * 1").unwrap();
        assert_eq!(
            either.next_after(at(2026, 11, 23, 12, 0)),
            Some(at(2026, 11, 30, 0, 0)),
            "Monday the 30th comes before the 1st"
        );
    }

    #[test]
    fn every_expression_of_the_grammar_runs() {
        // The edges of each field, steps, lists, L and Sunday as 7.
        for ok in [
            "0 0 1 1 0",
            "59 23 31 12 7",
            "00 09 L * *",
            "*/59 */23 */31 */12 */7",
            "0,15,30,45 0,12 1,15 1,6,12 1,3,5",
            " 5 4 * * * ",
        ] {
            let c = CronExpr::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert!(c.next_after(at(2026, 1, 1, 0, 0)).is_some(), "{ok} fires");
        }
    }

    #[test]
    fn a_bad_expression_says_why() {
        for bad in ["", "* * *", "0 0 * * * *", "61 * * * *", "nonsense"] {
            let e = CronExpr::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("invalid cron expression"),
                "{bad}: {e}"
            );
        }
        // Outside the API's grammar (see CRON_PATTERN), though croniter would take them.
        for narrower in [
            "@daily",
            "0 0 * * 1-5",
            "0 0 * * MON",
            "0 0 01 * *",
            "5/10 * * * *",
        ] {
            assert!(CronExpr::parse(narrower).is_err(), "{narrower}");
        }
    }
}
