//! Fair share across organisations: which organisation's automatic work a pop serves next.
//!
//! Stride scheduling (Waldspurger and Weihl, 1995), the rule behind Temporal's fairness keys and
//! Linux' CFS: every organisation with queued work carries a *pass*, a virtual time; a pop serves
//! the organisation with the lowest pass and advances it by its *stride*, `STRIDE / weight`. Over
//! any stretch in which several organisations have work, each is served in proportion to its
//! weight, whatever each brought: one that pushed 9,000 tasks and ten that pushed 100 take turns.
//! An organisation whose work runs out leaves the rotation; when it comes back it starts at the
//! rotation's current virtual time, not at its old pass, so a quiet spell is no credit to be spent
//! in a burst (nor a debt).
//!
//! Within an organisation the heap's order stands (priority, then age), and user scans are not
//! subject to it: the caller serves any task of user priority first. The rotation is O(log k)
//! per pop for k organisations with queued work. It is derived state: a restart or a takeover
//! rebuilds it from the heap, every organisation starting level.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The pass an organisation of weight 1 advances by per pop; a weight `w` advances by
/// `STRIDE / w`. Large enough that weights up to [`WEIGHT_MAX`] keep distinct strides.
pub const STRIDE: u64 = 1 << 20;

/// The largest weight an organisation may be given.
pub const WEIGHT_MAX: u32 = 1_000;

/// How a scheduler orders automatic work across organisations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fairness {
    /// Organisations take turns (by weight); within one, the heap's order.
    Organisation,
    /// The heap's order alone: priority, then age, whoever's work it is.
    Off,
}

impl Fairness {
    /// The default of a scheduler: on for the workers' queues that ingestion fills in bulk
    /// (boefje, normalizer), off for reports, which users ask for one at a time.
    pub fn default_for(s: crate::domain::SchedulerId) -> Self {
        match s {
            crate::domain::SchedulerId::Report => Self::Off,
            _ => Self::Organisation,
        }
    }
}

/// Weights per organisation (default 1), parsed from `org=weight;org=weight`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Weights(Arc<HashMap<String, u32>>);

impl Weights {
    /// Parses `org=weight` pairs separated by `;` (an empty text is no weights). A weight is a
    /// whole number from 1 to [`WEIGHT_MAX`].
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut map = HashMap::new();
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((org, w)) = part.split_once('=') else {
                return Err(format!("`{part}` is not organisation=weight"));
            };
            let org = org.trim();
            if org.is_empty() {
                return Err(format!("`{part}` names no organisation"));
            }
            let w: u32 = w
                .trim()
                .parse()
                .ok()
                .filter(|w| (1..=WEIGHT_MAX).contains(w))
                .ok_or_else(|| {
                    format!("the weight of `{org}` must be a whole number from 1 to {WEIGHT_MAX}")
                })?;
            if map.insert(org.to_owned(), w).is_some() {
                return Err(format!("`{org}` is weighted twice"));
            }
        }
        Ok(Self(Arc::new(map)))
    }

    /// An organisation's weight.
    pub fn of(&self, org: &str) -> u32 {
        self.0.get(org).copied().unwrap_or(1)
    }
}

/// Passes of organisations that left kept at least before a sweep.
const SWEEP_FLOOR: usize = 1024;

/// One scheduler's rotation of organisations.
#[derive(Debug, Default)]
pub struct FairShare {
    on: bool,
    weights: Weights,
    /// Every organisation seen whose pass may still count: those with queued work, and those
    /// that left ahead of the rotation's time (served more than their turn), which rejoin where
    /// they left. One that left at or behind it rejoins at the rotation's time whatever its
    /// pass, so it is forgotten by the sweep at a join: organisations deleted, or made up in
    /// pushes, do not pile up. (Not at a leave: a pop takes the task out, which may leave, and
    /// then charges the organisation's pass.)
    pass: HashMap<Arc<str>, u64>,
    /// The organisations with queued work, by pass (then name, so the order is total).
    active: BTreeSet<(u64, Arc<str>)>,
    /// The rotation's virtual time: the pass of the organisation served last.
    now: u64,
}

impl FairShare {
    /// A rotation, on or off.
    pub fn new(fairness: Fairness, weights: Weights) -> Self {
        Self {
            on: fairness == Fairness::Organisation,
            weights,
            ..Self::default()
        }
    }

    /// Whether organisations take turns.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// An organisation now has queued work: it joins the rotation at the current virtual time.
    pub fn join(&mut self, org: &Arc<str>) {
        if !self.on {
            return;
        }
        let now = self.now;
        // Those that left at or behind the rotation's time would rejoin at it whatever their
        // pass: forgotten once they outnumber the active ones (so a sweep costs O(1) a join).
        if self.pass.len() > 2 * self.active.len() + SWEEP_FLOOR {
            let active = &self.active;
            self.pass
                .retain(|org, pass| *pass > now || active.contains(&(*pass, org.clone())));
        }
        let pass = self.pass.entry(org.clone()).or_insert(now);
        *pass = (*pass).max(now);
        self.active.insert((*pass, org.clone()));
    }

    /// An organisation's queued work ran out: it leaves the rotation.
    pub fn leave(&mut self, org: &Arc<str>) {
        if let Some(pass) = self.pass.get(org) {
            self.active.remove(&(*pass, org.clone()));
        }
    }

    /// An organisation was served one automatic task: its pass advances by its stride.
    pub fn charge(&mut self, org: &Arc<str>) {
        if !self.on {
            return;
        }
        let Some(pass) = self.pass.get_mut(org) else {
            return;
        };
        let old = *pass;
        let new = old.saturating_add(STRIDE / u64::from(self.weights.of(org).max(1)));
        *pass = new;
        self.now = self.now.max(old);
        if self.active.remove(&(old, org.clone())) {
            self.active.insert((new, org.clone()));
        }
    }

    /// The organisations with queued work, the one to serve first first.
    pub fn order(&self) -> impl Iterator<Item = &Arc<str>> + '_ {
        self.active.iter().map(|(_, org)| org)
    }

    /// An organisation's place in the rotation (0: served next), if it has queued work.
    pub fn turn_of(&self, org: &str) -> Option<usize> {
        self.order().position(|o| &**o == org)
    }

    /// The same rotation with no organisation in it, for a heap rebuilt from the table: every
    /// organisation found there joins again, at the pass it had (a rebuild after a fault keeps
    /// whose turn it is).
    pub fn emptied(mut self) -> Self {
        self.active.clear();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn org(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    /// Serves `n` pops from organisations holding `backlog` tasks each; answers who was served.
    fn serve(
        fair: &mut FairShare,
        backlog: &mut HashMap<Arc<str>, usize>,
        n: usize,
    ) -> Vec<Arc<str>> {
        let mut out = Vec::new();
        for _ in 0..n {
            let Some(next) = fair.order().next().cloned() else {
                break;
            };
            // In the heap's order of a pop: the task taken out (its organisation leaving with its
            // last one), then its organisation charged.
            let left = backlog.get_mut(&next).unwrap();
            *left -= 1;
            if *left == 0 {
                fair.leave(&next);
            }
            fair.charge(&next);
            out.push(next);
        }
        out
    }

    #[test]
    fn organisations_take_turns_whatever_each_brought() {
        let mut fair = FairShare::new(Fairness::Organisation, Weights::default());
        let mut backlog: HashMap<Arc<str>, usize> = HashMap::new();
        backlog.insert(org("big"), 9_000);
        fair.join(&org("big"));
        serve(&mut fair, &mut backlog, 500);
        for i in 0..10 {
            let o = org(&format!("small{i}"));
            backlog.insert(o.clone(), 100);
            fair.join(&o);
        }
        let served = serve(&mut fair, &mut backlog, 1_100);
        let small = served.iter().filter(|o| o.starts_with("small")).count();
        assert_eq!(small, 1_000, "ten of every eleven pops are the small ones'");
        assert_eq!(backlog[&org("big")], 9_000 - 500 - 100);
    }

    #[test]
    fn a_weight_is_a_share() {
        let mut fair = FairShare::new(
            Fairness::Organisation,
            Weights::parse("a=3; b = 1").unwrap(),
        );
        let mut backlog: HashMap<Arc<str>, usize> =
            [(org("a"), 1_000), (org("b"), 1_000)].into_iter().collect();
        fair.join(&org("a"));
        fair.join(&org("b"));
        let served = serve(&mut fair, &mut backlog, 400);
        let a = served.iter().filter(|o| &***o == "a").count();
        assert_eq!(a, 300);
    }

    #[test]
    fn a_quiet_spell_is_neither_credit_nor_debt() {
        let mut fair = FairShare::new(Fairness::Organisation, Weights::default());
        let mut backlog: HashMap<Arc<str>, usize> =
            [(org("a"), 1), (org("b"), 1_000)].into_iter().collect();
        fair.join(&org("a"));
        fair.join(&org("b"));
        serve(&mut fair, &mut backlog, 200);
        assert_eq!(backlog[&org("a")], 0, "a left after its one task");
        // a comes back after b was served 199 times: it takes turns with b from here, not 199
        // pops in a row.
        backlog.insert(org("a"), 50);
        fair.join(&org("a"));
        let served = serve(&mut fair, &mut backlog, 20);
        let a = served.iter().filter(|o| &***o == "a").count();
        assert!((9..=11).contains(&a), "{a} of 20");
    }

    #[test]
    fn organisations_that_came_and_went_are_forgotten() {
        let mut fair = FairShare::new(Fairness::Organisation, Weights::default());
        let mut backlog: HashMap<Arc<str>, usize> = HashMap::new();
        backlog.insert(org("steady"), 100_000);
        fair.join(&org("steady"));
        // Five thousand organisations each bring one task, one after another.
        for i in 0..5_000 {
            let o = org(&format!("once{i}"));
            backlog.insert(o.clone(), 1);
            fair.join(&o);
            serve(&mut fair, &mut backlog, 2);
        }
        assert!(
            fair.pass.len() <= 2 * 2 + SWEEP_FLOOR + 1,
            "{}",
            fair.pass.len()
        );
        // The one still here keeps its place.
        assert_eq!(fair.turn_of("steady"), Some(0));
    }

    #[test]
    fn an_organisation_served_its_last_task_rejoins_behind_as_it_was_charged() {
        // One task at a time from `once`, a backlog from `big`: they take turns.
        let mut fair = FairShare::new(Fairness::Organisation, Weights::default());
        let mut backlog: HashMap<Arc<str>, usize> = HashMap::new();
        backlog.insert(org("big"), 1_000);
        fair.join(&org("big"));
        let mut served = Vec::new();
        for _ in 0..20 {
            backlog.insert(org("once"), 1);
            fair.join(&org("once"));
            while backlog[&org("once")] > 0 {
                served.extend(serve(&mut fair, &mut backlog, 1));
            }
        }
        let big = served.iter().filter(|o| &***o == "big").count();
        assert!(
            big >= 18,
            "{big} of big's between once's 20: they take turns"
        );
    }

    #[test]
    fn off_is_no_rotation() {
        let mut fair = FairShare::new(Fairness::Off, Weights::default());
        fair.join(&org("a"));
        assert_eq!(fair.order().count(), 0);
        assert!(!fair.is_on());
    }

    #[test]
    fn weights_name_what_is_wrong() {
        assert!(Weights::parse("").unwrap().0.is_empty());
        for (bad, says) in [
            ("a", "not organisation=weight"),
            ("=2", "names no organisation"),
            ("a=0", "from 1 to"),
            ("a=x", "from 1 to"),
            ("a=1;a=2", "weighted twice"),
        ] {
            let e = Weights::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
