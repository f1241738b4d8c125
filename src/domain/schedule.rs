//! Schedules: recurring work (mula's `Schedule`): a scheduler, an organisation, the task data to
//! run and when: a cron expression, or a deadline. Cron expressions are read and evaluated as
//! Python's croniter does, in UTC, as mula evaluates them (see [`super::cron`]).

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::SchedulerId;
pub use super::cron::{CronError, CronExpr};

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
    /// Why the scheduler disabled it (its plugin or object is gone, or no longer permitted);
    /// such a schedule is enabled again when its work is planned again. Null for a schedule a
    /// client disabled.
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
    fn a_cadence_follows_its_cron_and_else_its_wait() {
        let cadence = Cadence {
            grace: std::time::Duration::from_secs(3600),
            jitter: std::time::Duration::ZERO,
        };
        let now = at(2026, 11, 23, 12, 0);
        // croniter's nicknames and names, as plugins and schedules write them.
        assert_eq!(
            cadence.next("k", Some("@daily"), None, now),
            Some(at(2026, 11, 24, 0, 0))
        );
        assert_eq!(
            cadence.next("k", Some("0 9 * * MON-FRI"), None, now),
            Some(at(2026, 11, 24, 9, 0)),
            "the 23rd is a Monday past 09:00"
        );
        // An expression croniter refuses counts as none: the wait, or the grace period.
        assert_eq!(
            cadence.next(
                "k",
                Some("@fortnightly"),
                Some(Some(chrono::Duration::minutes(5))),
                now
            ),
            Some(now + chrono::Duration::minutes(5))
        );
        assert_eq!(
            cadence.next("k", Some("61 * * * *"), Some(None), now),
            Some(now + chrono::Duration::hours(1))
        );
        assert_eq!(cadence.next("k", None, None, now), None);
    }

    #[test]
    fn work_planned_together_comes_due_spread_over_the_jitter_the_same_each_time() {
        let jitter =
            std::time::Duration::from_secs(crate::config::CronSettings::default().jitter_secs);
        assert_eq!(jitter.as_secs(), 5 * 3600, "mula's 0-5 h");
        let cadence = Cadence {
            grace: std::time::Duration::from_secs(86_400),
            jitter,
        };
        let now = at(2026, 11, 23, 12, 0);
        let day = now + chrono::Duration::days(1);
        let spreads: Vec<i64> = (0..1000)
            .map(|i| {
                let key = format!("Hostname|internet|h{i}.nl-dns-records-org1");
                let next = cadence.next(&key, None, Some(None), now).unwrap();
                assert_eq!(cadence.next(&key, None, Some(None), now), Some(next));
                (next - day).num_seconds()
            })
            .collect();
        assert!(spreads.iter().all(|s| (0..5 * 3600).contains(s)));
        // Over the whole range, each hour of it holding about a fifth.
        for hour in 0..5 {
            let n = spreads.iter().filter(|s| **s / 3600 == hour).count();
            assert!((150..250).contains(&n), "hour {hour}: {n}");
        }
    }
}
