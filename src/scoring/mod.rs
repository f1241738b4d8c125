//! CalculateScore: how urgent planned work is. A strategy turns what is known of a piece of work
//! (when it was created, when it last ran, whether that run failed, whether its object's findings
//! changed, the scan level) into a priority, or into "not now" (inside its grace period), and
//! says which terms gave that result, so `GET /tasks/{id}/explain` can show them.
//!
//! Strategies are pure functions of their inputs and the time they are given. Every priority a
//! strategy gives is at least [`AUTOMATIC_MIN`], so a user's push (priority 1) always goes first.
//!
//! | strategy | file | order |
//! |---|---|---|
//! | `time-based` | [`time_based`] | older work first (mula's current ranker) |
//! | `grace-period` | [`grace_period`] | never run first; inside the grace period not at all; then the longer since the last run, the sooner (mula's 2024 ranker, without its seconds-of-day bug) |
//! | `change-delta` | [`change_delta`] | work whose object's findings changed, or whose last run failed, sooner; a higher scan level sooner |

pub mod change_delta;
pub mod grace_period;
pub mod time_based;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The lowest priority number a strategy gives: user pushes (1) always come before.
pub const AUTOMATIC_MIN: i64 = 2;

/// What a strategy knows of a piece of work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreInput {
    /// When the work is planned (the task's creation).
    pub now: DateTime<Utc>,
    /// When the same work last ran (its last finished task), if ever.
    pub last_run: Option<DateTime<Utc>>,
    /// Whether that run failed.
    pub last_failed: bool,
    /// Whether the object's findings changed since that run.
    pub findings_changed: bool,
    /// The object's scan level (0–4), if known.
    pub scan_level: Option<i64>,
    /// The time before the same work runs again (the plugin's interval, else the grace period).
    pub grace_secs: i64,
}

impl ScoreInput {
    /// Work planned at `now` that never ran, with a grace period of `grace`.
    pub fn fresh(now: DateTime<Utc>, grace: Duration) -> Self {
        Self {
            now,
            last_run: None,
            last_failed: false,
            findings_changed: false,
            scan_level: None,
            grace_secs: grace.num_seconds(),
        }
    }
}

/// A strategy's answer: a priority (`None`: not now, inside the grace period) and the terms
/// that gave it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// Lower is more urgent; `None` schedules nothing.
    pub priority: Option<i64>,
    /// Named terms, in the order they were applied.
    pub terms: Map<String, Value>,
}

impl Score {
    fn new() -> Self {
        Self {
            priority: None,
            terms: Map::new(),
        }
    }

    fn term(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.terms.insert(name.to_owned(), value.into());
        self
    }
}

/// A way of ranking planned work.
pub trait CalculateScore: Send + Sync {
    /// Its name in settings and explanations.
    fn name(&self) -> &'static str;

    /// The score of work with `input`.
    fn score(&self, input: &ScoreInput) -> Score;

    /// Whether it reads the work's history (its last run); when not, nobody looks it up.
    fn needs_history(&self) -> bool {
        true
    }

    /// Whether the same inputs give another priority later (its `now` is the time of scoring,
    /// not of planning): waiting work is then re-scored on the cron's `rescore` entry.
    fn depends_on_time(&self) -> bool {
        false
    }
}

/// The strategies by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// [`time_based::TimeBased`]
    TimeBased,
    /// [`grace_period::GracePeriod`]
    GracePeriod,
    /// [`change_delta::ChangeDelta`]
    ChangeDelta,
}

impl Strategy {
    /// The strategy itself.
    pub fn calculator(self) -> Box<dyn CalculateScore> {
        match self {
            Strategy::TimeBased => Box::new(time_based::TimeBased),
            Strategy::GracePeriod => Box::new(grace_period::GracePeriod),
            Strategy::ChangeDelta => Box::new(change_delta::ChangeDelta),
        }
    }
}

/// The strategy of each scheduler.
pub struct Scorer {
    by: crate::domain::PerScheduler<Box<dyn CalculateScore>>,
}

impl Scorer {
    /// Each scheduler with its strategy.
    pub fn new(strategies: crate::domain::PerScheduler<Strategy>) -> Self {
        Self {
            by: strategies.map(Strategy::calculator),
        }
    }

    /// Time-based for every scheduler (mula's).
    pub fn time_based() -> Self {
        Self::new(crate::domain::PerScheduler::from_fn(|_| {
            Strategy::TimeBased
        }))
    }

    /// Whether `scheduler`'s strategy reads the work's history.
    pub fn needs_history(&self, scheduler: crate::domain::SchedulerId) -> bool {
        self.by[scheduler].needs_history()
    }

    /// Whether `scheduler`'s strategy gives waiting work another priority as time passes.
    pub fn depends_on_time(&self, scheduler: crate::domain::SchedulerId) -> bool {
        self.by[scheduler].depends_on_time()
    }

    /// `scheduler`'s score of `input`, with its explanation when it gives a priority.
    pub fn score(
        &self,
        scheduler: crate::domain::SchedulerId,
        input: &ScoreInput,
    ) -> Option<(i64, Explanation)> {
        let c = &self.by[scheduler];
        let s = c.score(input);
        let priority = s.priority?;
        Some((
            priority,
            Explanation {
                strategy: c.name().to_owned(),
                inputs: serde_json::to_value(input).unwrap_or(Value::Null),
                terms: Value::Object(s.terms),
                priority,
                wait: None,
            },
        ))
    }
}

/// Why a task has its priority: the strategy, what it was given and the terms (or the client
/// that set it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Explanation {
    /// The strategy's name, or `client` for a priority a client pushed or patched.
    pub strategy: String,
    /// What the strategy was given (null for a client's priority).
    #[schema(value_type = Option<Object>)]
    pub inputs: Value,
    /// The terms that gave the priority.
    #[schema(value_type = Object)]
    pub terms: Value,
    /// The priority.
    pub priority: i64,
    /// For a waiting task: where it stands and what holds it back (absent for others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<crate::queue::Wait>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2027, 1, 1, 12, 0, 0).unwrap()
    }

    /// Inputs over a grid of histories, for the invariants every strategy keeps.
    fn grid() -> Vec<ScoreInput> {
        let mut out = Vec::new();
        for ago_h in [
            None,
            Some(0),
            Some(1),
            Some(23),
            Some(25),
            Some(24 * 6),
            Some(24 * 30),
        ] {
            for failed in [false, true] {
                for changed in [false, true] {
                    for level in [None, Some(0), Some(2), Some(4)] {
                        out.push(ScoreInput {
                            now: now(),
                            last_run: ago_h.map(|h| now() - Duration::hours(h)),
                            last_failed: failed,
                            findings_changed: changed,
                            scan_level: level,
                            grace_secs: 86_400,
                        });
                    }
                }
            }
        }
        out
    }

    #[test]
    fn no_strategy_outranks_a_user_scan() {
        for s in [
            Strategy::TimeBased,
            Strategy::GracePeriod,
            Strategy::ChangeDelta,
        ] {
            let c = s.calculator();
            for input in grid() {
                if let Some(p) = c.score(&input).priority {
                    assert!(p >= AUTOMATIC_MIN, "{}: {p} for {input:?}", c.name());
                }
            }
        }
    }

    /// A small deterministic generator (xorshift), so a failing case reproduces.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> i64 {
            (self.next() % n) as i64
        }

        fn input(&mut self) -> ScoreInput {
            let now = now() + Duration::seconds(self.below(86_400 * 365));
            ScoreInput {
                now,
                last_run: (self.below(5) > 0)
                    .then(|| now - Duration::seconds(self.below(86_400 * 30))),
                last_failed: self.below(2) == 0,
                findings_changed: self.below(2) == 0,
                scan_level: (self.below(6) > 0).then(|| self.below(5)),
                grace_secs: [3_600, 86_400, 7 * 86_400][self.below(3) as usize],
            }
        }
    }

    const CASES: usize = 20_000;

    fn priority(s: Strategy, input: &ScoreInput) -> Option<i64> {
        s.calculator().score(input).priority
    }

    #[test]
    fn property_work_that_never_ran_comes_before_work_that_did() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        for s in [Strategy::GracePeriod, Strategy::ChangeDelta] {
            for _ in 0..CASES {
                let ran = g.input();
                let never = ScoreInput {
                    last_run: None,
                    ..ran.clone()
                };
                if let (Some(a), Some(b)) = (priority(s, &never), priority(s, &ran)) {
                    assert!(a <= b, "{s:?}: never ran {a} after ran {b} for {ran:?}");
                }
            }
        }
    }

    #[test]
    fn property_grace_period_longer_overdue_is_never_later_and_waiting_only_climbs() {
        let mut g = Gen(0x2545_f491_4f6c_dd1d);
        for _ in 0..CASES {
            let a = g.input();
            let Some(last) = a.last_run else { continue };
            let older = ScoreInput {
                last_run: Some(last - Duration::seconds(g.below(86_400 * 10) + 1)),
                ..a.clone()
            };
            match (
                priority(Strategy::GracePeriod, &older),
                priority(Strategy::GracePeriod, &a),
            ) {
                (Some(o), Some(p)) => assert!(o <= p, "ran earlier {o} after {p} for {a:?}"),
                // Inside the grace period is "not now"; earlier work may already be due.
                (None, Some(_)) => panic!("earlier run inside the grace period for {a:?}"),
                _ => {}
            }
            // The same waiting work scored later never goes back (what the re-score relies on),
            // and two pieces of work never swap places as time passes.
            let later = ScoreInput {
                now: a.now + Duration::seconds(g.below(86_400 * 3)),
                ..a.clone()
            };
            let b = ScoreInput {
                last_run: Some(last - Duration::seconds(g.below(86_400 * 5))),
                ..a.clone()
            };
            let b_later = ScoreInput {
                now: later.now,
                ..b.clone()
            };
            if let (Some(p), Some(q)) = (
                priority(Strategy::GracePeriod, &a),
                priority(Strategy::GracePeriod, &later),
            ) {
                assert!(q <= p, "climbed back from {p} to {q} for {a:?}");
            }
            if let (Some(pa), Some(pb), Some(qa), Some(qb)) = (
                priority(Strategy::GracePeriod, &a),
                priority(Strategy::GracePeriod, &b),
                priority(Strategy::GracePeriod, &later),
                priority(Strategy::GracePeriod, &b_later),
            ) && pb < pa
            {
                assert!(
                    qb <= qa,
                    "swapped: {pb} < {pa} became {qb} > {qa} for {a:?}"
                );
            }
        }
    }

    #[test]
    fn property_change_delta_changed_failed_and_higher_levels_are_never_later() {
        let mut g = Gen(0x5851_f42d_4c95_7f2d);
        let c = Strategy::ChangeDelta;
        for _ in 0..CASES {
            let a = g.input();
            let changed = ScoreInput {
                findings_changed: true,
                ..a.clone()
            };
            let failed = ScoreInput {
                last_failed: true,
                ..a.clone()
            };
            let higher = ScoreInput {
                scan_level: Some(a.scan_level.unwrap_or(0).max(0) + 1),
                ..a.clone()
            };
            let p = priority(c, &a);
            for (what, other) in [
                ("changed", changed),
                ("failed", failed),
                ("higher level", higher),
            ] {
                assert!(priority(c, &other) <= p, "{what} later for {a:?}");
            }
        }
    }

    #[test]
    fn property_time_based_older_work_first() {
        let mut g = Gen(0x1405_7b7e_f767_814f);
        for _ in 0..CASES {
            let a = g.input();
            let older = ScoreInput {
                now: a.now - Duration::seconds(g.below(86_400 * 30)),
                ..a.clone()
            };
            assert!(
                priority(Strategy::TimeBased, &older) <= priority(Strategy::TimeBased, &a),
                "{a:?}"
            );
        }
    }

    #[test]
    fn a_strategy_is_a_pure_function_of_its_inputs() {
        for s in [
            Strategy::TimeBased,
            Strategy::GracePeriod,
            Strategy::ChangeDelta,
        ] {
            let c = s.calculator();
            for input in grid() {
                assert_eq!(c.score(&input), c.score(&input.clone()));
            }
        }
    }
}
