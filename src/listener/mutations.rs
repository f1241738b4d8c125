//! `scan_profile_mutations`: objects created or updated are upserted into the frontier and get a
//! boefje task for every plugin that may run on them; deleted ones are marked gone and their
//! organisation's waiting tasks for them are cancelled, unless Octopoes, asked first, holds the
//! object now (created again; see [`Listener::stale_deletes`]). An update that lowers an
//! object's scan level cancels the waiting work it no longer permits (see [`super::clearance`]).
//!
//! An object's events apply in the order Octopoes sent them, also when one is handed back: its
//! later events (in the batch, or already delivered behind it) are handed back too, until the
//! first comes back. Otherwise a delete that failed briefly, redelivered after the object's
//! re-creation, would cancel the new object's work; a create handed back, redelivered after the
//! object's delete, would bring the object back.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tracing::{info, warn};

use super::parked::object_key;
use super::{Listener, Outcome};
use crate::domain::event::{ObjectEvent, ObjectState, Operation, parse_object_event};
use crate::frontier::lookup::Known;
use crate::storage::frontier::FrontierRow;

/// How long an object's later events wait for its handed-back event to come back. It comes back
/// within a pause ([`super::RETRY_PAUSE`]) unless another instance's listener took it, which
/// this one cannot see: past this, order is given up rather than the object's events cycling.
const HOLD_LIMIT: chrono::Duration = chrono::Duration::seconds(30);

/// An object: its organisation and reference.
type Key = (String, String);

/// The objects whose event was handed back, each with that event (the first handed back,
/// which its later events wait behind) and when it was.
#[derive(Debug, Default)]
pub struct Holds(Mutex<HashMap<Key, Hold>>);

#[derive(Debug)]
struct Hold {
    /// The body of the event handed back first.
    head: Vec<u8>,
    /// When it was.
    since: DateTime<Utc>,
}

impl Holds {
    /// Whether an event of `key` must wait behind a handed-back one (`Some`: why). The
    /// handed-back event itself, redelivered, ends the hold and goes ahead; so does a hold past
    /// [`HOLD_LIMIT`].
    fn behind(
        &self,
        key: &Key,
        body: &[u8],
        redelivered: bool,
        now: DateTime<Utc>,
    ) -> Option<String> {
        let mut holds = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let hold = holds.get(key)?;
        if redelivered && hold.head == body {
            holds.remove(key);
            return None;
        }
        if now - hold.since > HOLD_LIMIT {
            warn!(
                organisation = %key.0,
                reference = %key.1,
                "an object's handed-back event did not come back: its later events go ahead"
            );
            holds.remove(key);
            return None;
        }
        Some(format!(
            "an earlier event about object {} waits to be tried again",
            key.1
        ))
    }

    /// `key`'s event `body` was handed back: the object's later events wait behind it (behind
    /// an earlier one, if one is held already). Holds past the limit are dropped here too, so
    /// those of objects no later event named do not stay.
    fn hold(&self, key: Key, body: &[u8], now: DateTime<Utc>) {
        let mut holds = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        holds.retain(|_, h| now - h.since <= HOLD_LIMIT);
        holds.entry(key).or_insert_with(|| Hold {
            head: body.to_vec(),
            since: now,
        });
    }

    /// Forgets `key`'s hold: its event was parked, and its later events now wait behind that
    /// (see [`super::parked`]).
    pub fn release(&self, key: &Key) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
    }

    /// Forgets every hold (a new connection: what was unacked is back in the queue, in order).
    pub fn clear(&self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

impl Listener {
    /// Decides a batch of messages (`redelivered[i]`: RabbitMQ delivered the i-th before), in
    /// order: the frontier write of a run of events about different objects is one transaction
    /// and their tasks one push; an object named twice starts a new run, so its events apply in
    /// the order they came, and an object with an event handed back has its later ones handed
    /// back too.
    pub(super) async fn on_mutations(
        &self,
        bodies: &[&[u8]],
        redelivered: &[bool],
    ) -> Vec<Outcome> {
        let now = self.planner.clock.now();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; bodies.len()];
        let parsed: Vec<_> = bodies.iter().map(|b| parse_object_event(b)).collect();
        // An object with an event parked has its later events parked behind it, unapplied.
        let keys: HashSet<String> = parsed
            .iter()
            .flatten()
            .map(|e| object_key(&e.organisation, &e.reference))
            .collect();
        let parked = match self
            .parking
            .parked_objects(keys.into_iter().collect())
            .await
        {
            Ok(p) => p,
            Err(e) => {
                // Whether an object's event waits parked is not known: none can be applied
                // in order, nor parked on its own (an earlier event of its object may be held,
                // and would be parked behind it). Handed back as events behind another.
                return parsed
                    .into_iter()
                    .map(|p| match p {
                        Ok(_) => {
                            Outcome::Behind(format!("the parked events could not be read: {e}"))
                        }
                        Err(e) => Outcome::Poison(e.0),
                    })
                    .collect();
            }
        };
        let mut run: Vec<(usize, ObjectEvent)> = Vec::new();
        let mut seen: HashSet<Key> = HashSet::new();
        for (i, (body, parsed)) in bodies.iter().zip(parsed).enumerate() {
            match parsed {
                Ok(e) => {
                    let key = (e.organisation.clone(), e.reference.clone());
                    if seen.contains(&key) {
                        self.apply_held(std::mem::take(&mut run), bodies, &mut outcomes, now)
                            .await;
                        seen.clear();
                    }
                    let again = redelivered.get(i).copied().unwrap_or(false);
                    if parked.contains(&object_key(&key.0, &key.1)) {
                        outcomes[i] = Some(Outcome::Park(format!(
                            "an earlier event about object {} is parked",
                            key.1
                        )));
                        continue;
                    }
                    if let Some(why) = self.holds.behind(&key, body, again, now) {
                        outcomes[i] = Some(Outcome::Behind(why));
                        continue;
                    }
                    seen.insert(key);
                    run.push((i, e));
                }
                Err(e) => outcomes[i] = Some(Outcome::Poison(e.0)),
            }
        }
        self.apply_held(run, bodies, &mut outcomes, now).await;
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Done))
            .collect()
    }

    /// Applies a run, then holds the objects of its events handed back.
    async fn apply_held(
        &self,
        run: Vec<(usize, ObjectEvent)>,
        bodies: &[&[u8]],
        outcomes: &mut [Option<Outcome>],
        now: DateTime<Utc>,
    ) {
        let keys: Vec<(usize, Key)> = run
            .iter()
            .map(|(i, e)| (*i, (e.organisation.clone(), e.reference.clone())))
            .collect();
        self.apply_run(run, outcomes).await;
        for (i, key) in keys {
            if matches!(outcomes[i], Some(Outcome::Retry(_))) {
                self.holds.hold(key, bodies[i], now);
            }
        }
    }

    pub(super) async fn apply_run(
        &self,
        run: Vec<(usize, ObjectEvent)>,
        outcomes: &mut [Option<Outcome>],
    ) {
        let mut held = self.stale_deletes(&run).await;
        let (stale, run): (Vec<_>, Vec<_>) =
            run.into_iter().partition(|(i, _)| held.contains_key(i));
        let mut recreated = Vec::with_capacity(stale.len());
        for (i, e) in stale {
            info!(organisation = %e.organisation, object = %e.reference, "a delete of an object Octopoes holds now was not applied: the object was created again since (its create applied before its delete, by another instance)");
            outcomes[i] = Some(Outcome::Done);
            // The object as Octopoes holds it now may be at a lower level than the work its
            // earlier life left waiting (a re-created object starts with an empty profile): that
            // work is weighed as an update to Octopoes' level would be. An answer without a level
            // says nothing of it, and a cancel cannot be undone: that work is left alone.
            if let Some(row) = held.remove(&i)
                && let Some(level) = row.scan_level
            {
                recreated.push((
                    i,
                    ObjectEvent {
                        operation: Operation::Update,
                        organisation: e.organisation,
                        reference: e.reference,
                        object: Some(ObjectState {
                            object_type: row.object_type,
                            scan_level: Some(level),
                            scan_profile_type: row.scan_profile_type,
                        }),
                    },
                ));
            }
        }
        if !recreated.is_empty() {
            self.withdraw_clearances(&recreated, outcomes).await;
        }
        if run.is_empty() {
            return;
        }
        let now = self.planner.clock.now();
        let events: Vec<&ObjectEvent> = run.iter().map(|(_, e)| e).collect();
        // The frontier write and the planning do not wait for each other (planning reads other
        // organisations' rows, never this run's): both commit before anything is acked.
        let (written, planned) = tokio::join!(
            self.frontier.apply_objects(&events, now.naive_utc()),
            self.planner.objects(&events)
        );
        if let Err(e) = written {
            if run.len() > 1 && e.is_request_fault() {
                // One event broke the statement: apply them one by one to find it.
                for (i, event) in run {
                    Box::pin(self.apply_run(vec![(i, event)], outcomes)).await;
                }
            } else {
                let outcome = Outcome::of_storage(&e);
                for (i, _) in &run {
                    outcomes[*i] = Some(outcome.clone());
                }
            }
            return;
        }
        for ((i, event), planned) in run.iter().zip(planned) {
            let mut outcome = Outcome::of_plan(&planned);
            if event.object.is_none() && matches!(outcome, Outcome::Done) {
                outcome = Outcome::of_plan(
                    &self
                        .planner
                        .gone(&event.organisation, &event.reference)
                        .await,
                );
            }
            outcomes[*i] = Some(outcome);
        }
        self.withdraw_clearances(&run, outcomes).await;
    }
}

impl Listener {
    /// The deletes of `run` that Octopoes contradicts now (it holds the object): their places,
    /// with the object as Octopoes holds it.
    /// A delete cancels the object's waiting work for good, and with several instances an
    /// object's events are not ordered between them, so one may come after the object's
    /// re-creation that another instance applied. The lookup records Octopoes' answer in the
    /// frontier. With no Octopoes to ask, or no answer, the delete stands: it is Octopoes' own
    /// word, and no later one is known.
    async fn stale_deletes(&self, run: &[(usize, ObjectEvent)]) -> HashMap<usize, FrontierRow> {
        let lookup = &self.planner.objects;
        let mut out = HashMap::new();
        if !lookup.asks_octopoes() {
            return out;
        }
        let mut by_org: HashMap<&str, Vec<(usize, &str)>> = HashMap::new();
        for (i, e) in run.iter().filter(|(_, e)| e.object.is_none()) {
            by_org
                .entry(e.organisation.as_str())
                .or_default()
                .push((*i, e.reference.as_str()));
        }
        for (org, deletes) in by_org {
            let refs: Vec<String> = deletes.iter().map(|(_, r)| (*r).to_owned()).collect();
            let budget = std::sync::atomic::AtomicUsize::new(refs.len());
            let Ok(known) = lookup.confirmed(org, &refs, &budget).await else {
                continue;
            };
            out.extend(deletes.iter().filter_map(|(i, r)| match known.get(*r) {
                Some(Known::Present(row)) => Some((*i, row.clone())),
                _ => None,
            }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn key(r: &str) -> Key {
        ("org1".into(), r.into())
    }

    #[test]
    fn an_objects_later_events_wait_until_its_handed_back_one_comes_back() {
        let h = Holds::default();
        assert_eq!(h.behind(&key("x"), b"create", false, at(0)), None);
        h.hold(key("x"), b"create", at(0));
        // Behind it: a later event, new or redelivered, and the same body not redelivered.
        assert!(h.behind(&key("x"), b"delete", false, at(1)).is_some());
        assert!(h.behind(&key("x"), b"delete", true, at(1)).is_some());
        assert!(h.behind(&key("x"), b"create", false, at(1)).is_some());
        // Another object goes ahead.
        assert_eq!(h.behind(&key("y"), b"delete", false, at(1)), None);
        // A later hold of the same object keeps the first as the one waited for.
        h.hold(key("x"), b"delete", at(1));
        assert!(h.behind(&key("x"), b"delete", true, at(2)).is_some());
        // The first, redelivered, ends the hold: what follows goes ahead.
        assert_eq!(h.behind(&key("x"), b"create", true, at(2)), None);
        assert_eq!(h.behind(&key("x"), b"delete", true, at(2)), None);
    }

    #[test]
    fn a_hold_whose_event_never_comes_back_ends_after_the_limit() {
        let h = Holds::default();
        h.hold(key("x"), b"create", at(0));
        assert!(h.behind(&key("x"), b"delete", false, at(30)).is_some());
        assert_eq!(h.behind(&key("x"), b"delete", false, at(31)), None);
        assert_eq!(h.behind(&key("x"), b"delete", false, at(31)), None);
    }

    #[test]
    fn holds_past_the_limit_are_dropped_when_another_is_taken() {
        let h = Holds::default();
        h.hold(key("x"), b"create", at(0));
        h.hold(key("y"), b"create", at(31));
        assert_eq!(h.0.lock().unwrap().len(), 1);
        assert!(h.behind(&key("y"), b"delete", false, at(32)).is_some());
    }

    #[test]
    fn a_new_connection_forgets_every_hold() {
        let h = Holds::default();
        h.hold(key("x"), b"create", at(0));
        h.clear();
        assert_eq!(h.behind(&key("x"), b"delete", false, at(1)), None);
    }
}
