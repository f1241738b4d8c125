//! CalculateScore: how urgent planned work is. A strategy turns what is known of a piece of work
//! (when it was created, when it last ran, whether that run failed, whether its object's findings
//! changed, the scan level) into a priority, or into "not now" (inside its grace period), and
//! says which terms gave that result, so `GET /tasks/{id}/explain` can show them.
//!
//! Strategies are pure functions of their inputs. Every priority a strategy gives is at least
//! [`AUTOMATIC_MIN`], so a user's push (priority 1) always goes first.
//!
//! **Priorities do not age.** A priority is an ordering key fixed when the work is planned: it
//! never changes while the work waits, however much time passes, so nothing is rewritten as time
//! passes (before, `grace-period` re-scored every waiting task every 10 minutes: 293.7 s for a
//! million). A strategy whose urgency grows with time expresses it as the moment the work became
//! due: every waiting task's urgency grows at the same rate, so the order among them is the order
//! of those moments (see [`grace_period`]). Only what a strategy reads of the work's inputs can
//! change its priority, and only on the event that changed them (an object's scan level or
//! findings: the planner, `planner/rescore.rs`). Terms that do move with time (how long overdue)
//! are computed when asked ([`explain_at`]), from the inputs recorded with the task.
//!
//! | strategy | file | order |
//! |---|---|---|
//! | `time-based` | [`time_based`] | older work first (mula's current ranker): the creation moment |
//! | `grace-period` | [`grace_period`] | never run first; inside the grace period not at all; then the longer overdue, the sooner: the moment it became due |
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

    /// The score of work planned with `input` (at `input.now`).
    fn score(&self, input: &ScoreInput) -> Score {
        self.score_at(input, input.now)
    }

    /// The score of work planned with `input`, as it stands at `at` (not before `input.now`):
    /// the same priority whenever it is asked (priorities do not age, see the module doc), with
    /// the terms that move with time (how long overdue) as of `at`. `None` (not now) only
    /// before the work is due.
    fn score_at(&self, input: &ScoreInput, at: DateTime<Utc>) -> Score;

    /// Whether it reads the work's history (its last run); when not, nobody looks it up.
    fn needs_history(&self) -> bool {
        true
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

    /// The strategy an explanation names (its `strategy`), if it is one.
    pub fn named(name: &str) -> Option<Strategy> {
        serde_json::from_value(Value::String(name.to_owned())).ok()
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

    /// `scheduler`'s score of `input`, with its explanation when it gives a priority.
    pub fn score(
        &self,
        scheduler: crate::domain::SchedulerId,
        input: &ScoreInput,
    ) -> Option<(i64, Explanation)> {
        explained(self.by[scheduler].as_ref(), input, input.now)
    }

    /// A waiting task's score after an event changed its inputs (`now`: the inputs as the event
    /// gives them; the moment it was planned stays the recorded one, so a creation-time priority
    /// does not move): its new priority and explanation, or `None` when nothing it reads
    /// changed, its strategy gives the same priority, or gives none (work inside its grace
    /// period stays as it was planned). `was` is the explanation recorded with the task; the
    /// caller checks it still matches the task's priority (otherwise a client set it).
    pub fn rescore(
        &self,
        scheduler: crate::domain::SchedulerId,
        was: &Explanation,
        now: &ScoreInput,
    ) -> Option<(i64, Explanation)> {
        let recorded = serde_json::from_value::<ScoreInput>(was.inputs.clone()).ok()?;
        let input = ScoreInput {
            now: recorded.now,
            ..now.clone()
        };
        if input == recorded && was.strategy == self.by[scheduler].name() {
            return None;
        }
        self.score(scheduler, &input)
            .filter(|(p, _)| *p != was.priority)
    }
}

/// A recorded explanation as it stands at `at`: the terms computed again from its recorded
/// inputs by the strategy it names (terms that move with time, such as how long overdue,
/// as of `at`). `None` when it cannot be (no recorded inputs, a strategy no longer known, or
/// a priority from before priorities stopped aging): the caller shows it as recorded.
pub fn explain_at(was: &Explanation, at: DateTime<Utc>) -> Option<Explanation> {
    let strategy = Strategy::named(&was.strategy)?.calculator();
    let input = serde_json::from_value::<ScoreInput>(was.inputs.clone()).ok()?;
    let (priority, mut e) = explained(strategy.as_ref(), &input, at.max(input.now))?;
    if priority != was.priority {
        return None;
    }
    e.wait = was.wait.clone();
    Some(e)
}

/// `c`'s score of `input` as it stands at `at`, with its explanation when it gives a priority.
fn explained(
    c: &dyn CalculateScore,
    input: &ScoreInput,
    at: DateTime<Utc>,
) -> Option<(i64, Explanation)> {
    let s = c.score_at(input, at);
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
    pub wait: Option<crate::domain::wait::Wait>,
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
    fn property_grace_period_longer_overdue_is_never_later() {
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
        }
    }

    /// mula's grace-period number at `at` (the score that used to be re-scored every 10
    /// minutes): 2 for work that never ran, else `3 + 997 · (1 − overdue / 7 days)` in 3–1000.
    fn mulas_number(input: &ScoreInput, at: DateTime<Utc>) -> i64 {
        match input.last_run {
            None => grace_period::NEVER_RAN,
            Some(last) => grace_period::overdue_score(
                (at - last - Duration::seconds(input.grace_secs)).num_seconds(),
            ),
        }
    }

    /// Planned grace-period work: inputs its strategy schedules at their `now`.
    fn due_work(g: &mut Gen) -> (ScoreInput, i64) {
        loop {
            let i = g.input();
            if let Some(p) = priority(Strategy::GracePeriod, &i) {
                return (i, p);
            }
        }
    }

    /// The stored priority (the due moment) orders waiting work as mula's number, recomputed
    /// at any later instant, does: it never puts two tasks the other way round, and ties only
    /// two due moments within one second. Where mula's number ties (its clamps and steps) the
    /// due moment decides.
    #[test]
    fn property_the_stored_priority_orders_as_mulas_number_at_any_later_instant() {
        let mut g = Gen(0x6a09_e667_f3bc_c908);
        for _ in 0..CASES {
            let ((a, ka), (b, kb)) = (due_work(&mut g), due_work(&mut g));
            let at = a.now.max(b.now) + Duration::seconds(g.below(86_400 * 30));
            let (ma, mb) = (mulas_number(&a, at), mulas_number(&b, at));
            assert!(!(ma < mb && ka > kb), "inverted at {at}: {a:?} {b:?}");
            assert!(!(ka < kb && ma > mb), "inverted at {at}: {a:?} {b:?}");
            if ka == kb && a.last_run.is_some() && b.last_run.is_some() {
                let due = |i: &ScoreInput| {
                    i.last_run
                        .map(|l| (l + Duration::seconds(i.grace_secs)).timestamp())
                };
                assert_eq!(
                    due(&a),
                    due(&b),
                    "a tie only within one second: {a:?} {b:?}"
                );
            }
        }
        // Whole backlogs: sorted by the stored priority, mula's number at a later instant never
        // goes down from one priority to the next.
        for _ in 0..200 {
            let mut waiting: Vec<(ScoreInput, i64)> = (0..50).map(|_| due_work(&mut g)).collect();
            waiting.sort_by_key(|(_, k)| *k);
            let latest = waiting.iter().map(|(i, _)| i.now).max().unwrap();
            let at = latest + Duration::seconds(g.below(86_400 * 14));
            for pair in waiting.windows(2) {
                let ((a, ka), (b, kb)) = (&pair[0], &pair[1]);
                if ka < kb {
                    assert!(
                        mulas_number(a, at) <= mulas_number(b, at),
                        "{a:?} {b:?} at {at}"
                    );
                }
            }
        }
    }

    /// No strategy's priority moves while the work waits: asked at any later instant, the same
    /// priority (what lets the periodic re-score go).
    #[test]
    fn property_no_priority_ages() {
        let mut g = Gen(0xbb67_ae85_84ca_a73b);
        for s in [
            Strategy::TimeBased,
            Strategy::GracePeriod,
            Strategy::ChangeDelta,
        ] {
            let c = s.calculator();
            for _ in 0..CASES {
                let i = g.input();
                let later = i.now + Duration::seconds(g.below(86_400 * 365));
                let planned = c.score(&i).priority;
                if planned.is_some() {
                    assert_eq!(c.score_at(&i, later).priority, planned, "{s:?}: {i:?}");
                }
            }
        }
    }

    #[test]
    fn an_explanation_is_computed_again_when_asked_and_a_rescore_changes_only_what_moved() {
        let scorer = Scorer::new(crate::domain::PerScheduler::from_fn(|_| {
            Strategy::ChangeDelta
        }));
        let boefje = crate::domain::SchedulerId::Boefje;
        let input = ScoreInput {
            last_run: Some(now() - Duration::days(2)),
            scan_level: Some(1),
            ..ScoreInput::fresh(now(), Duration::days(1))
        };
        let (p, was) = scorer.score(boefje, &input).unwrap();
        // The same event again, a day later: nothing it reads changed.
        let again = ScoreInput {
            now: now() + Duration::days(1),
            ..input.clone()
        };
        assert_eq!(scorer.rescore(boefje, &was, &again), None);
        // The object's scan level went up: sooner, the planning moment kept.
        let higher = ScoreInput {
            scan_level: Some(3),
            ..again.clone()
        };
        let (q, e) = scorer.rescore(boefje, &was, &higher).unwrap();
        assert_eq!(q, p - 2 * change_delta::PER_LEVEL);
        assert_eq!(e.inputs["now"], serde_json::to_value(now()).unwrap());
        assert_eq!(e.inputs["scan_level"], 3);
        // Grace-period: asked a week later, the same priority, the overdue terms of that day.
        let grace = Scorer::new(crate::domain::PerScheduler::from_fn(|_| {
            Strategy::GracePeriod
        }));
        let (p, was) = grace.score(boefje, &input).unwrap();
        let asked = explain_at(&was, now() + Duration::days(7)).unwrap();
        assert_eq!(asked.priority, p);
        assert_eq!(asked.terms["seconds_overdue"], 8 * 86_400);
        // A recorded priority the inputs no longer give (one from before priorities stopped
        // aging) is not explained again.
        let legacy = Explanation {
            priority: 512,
            ..was.clone()
        };
        assert_eq!(explain_at(&legacy, now()), None);
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
