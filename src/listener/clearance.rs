//! A withdrawn clearance: an update that lowers an object's scan level below a boefje's cancels
//! that boefje's waiting tasks on the object. A scan level is the user's permission to scan, and
//! OpenKAT's runners do not check it: a task planned while the level allowed it (or a user's
//! scan) would otherwise still run after the permission was taken back. mula leaves such work
//! queued.
//!
//! The cancel cannot be undone, so it is decided on the best word there is. The object's level
//! is Octopoes' of now when an Octopoes is configured (with several instances an object's events
//! are not ordered between them, so an update may come after a later one that raised the level
//! again), else the event's, which is Octopoes' own. A boefje's level is Katalogus' of now; while
//! Katalogus cannot answer, the catalogue's last copy's. A plugin's scan level is part of its
//! definition, which changes only with a new version of it, and erring on the copy's side errs
//! towards not scanning; the cancelled work is planned again by the event that raises the level,
//! and its schedule, if a fire disabled it meanwhile, is enabled again then.
//!
//! Updates are looked at, and deletes Octopoes contradicts (the object was created again since
//! the delete, and its earlier life's work waits; weighed at Octopoes' level of now, and left
//! alone when its answer carries no level). A create is a new object (or one whose delete cancelled its work), which
//! nothing waits for yet.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;

use tracing::{info, warn};

use super::{Listener, Outcome};
use crate::domain::event::{ObjectEvent, Operation};
use crate::domain::plugin::{Plugin, PluginType};
use crate::frontier::lookup::Known;

/// The boefjes among `plugins` that consume `object_type` and need a scan level above `level`.
pub(crate) fn above(plugins: &[Plugin], object_type: &str, level: i64) -> Vec<String> {
    plugins
        .iter()
        .filter(|p| p.plugin_type == PluginType::Boefje)
        .filter(|p| p.consumes.iter().any(|t| t == object_type))
        .filter(|p| p.scan_level.is_some_and(|need| need > level))
        .map(|p| p.id.clone())
        .collect()
}

/// An update whose object's level may now be below some boefjes' levels.
struct Lowered<'a> {
    /// Its place in the batch.
    at: usize,
    event: &'a ObjectEvent,
    object_type: &'a str,
    /// The object's level: the event's, then Octopoes' of now.
    level: i64,
}

impl Listener {
    /// Cancels the waiting tasks that the updates of `run` no longer permit (see the module's
    /// documentation); a cancel that failed hands its event back.
    pub(super) async fn withdraw_clearances(
        &self,
        run: &[(usize, ObjectEvent)],
        outcomes: &mut [Option<Outcome>],
    ) {
        let catalogue = &self.planner.catalogue;
        let mut by_org: HashMap<&str, Vec<Lowered<'_>>> = HashMap::new();
        for (at, event) in run {
            let Some(object) = &event.object else {
                continue;
            };
            let (Operation::Update, Some(level)) = (event.operation, object.scan_level) else {
                continue;
            };
            // The copy, stale or not, only picks the updates worth a closer look.
            let Ok(plugins) = catalogue.plugins(&event.organisation).await else {
                continue;
            };
            if above(&plugins, &object.object_type, level).is_empty() {
                continue;
            }
            by_org
                .entry(event.organisation.as_str())
                .or_default()
                .push(Lowered {
                    at: *at,
                    event,
                    object_type: &object.object_type,
                    level,
                });
        }
        let mut withdrawals = Vec::new();
        for (org, mut lowered) in by_org {
            self.confirm_levels(org, &mut lowered).await;
            let plugins = match catalogue.plugins_confirmed(org).await {
                Ok(p) => p,
                Err(e) => match catalogue.plugins(org).await {
                    Ok(copy) => {
                        warn!(organisation = %org, error = %e, "Katalogus could not confirm the plugins' scan levels for a lowered clearance: the catalogue's last copy decides");
                        copy
                    }
                    Err(_) => {
                        for l in &lowered {
                            outcomes[l.at] = Some(Outcome::Retry(e.to_string()));
                        }
                        continue;
                    }
                },
            };
            for l in lowered {
                let ids = above(&plugins, l.object_type, l.level);
                if !ids.is_empty() {
                    withdrawals.push((l.at, org, &l.event.reference, l.level, ids));
                }
            }
        }
        // All at once: the engine takes them in one batch, one transaction.
        let broker = &self.planner.broker;
        let results = futures_util::future::join_all(
            withdrawals
                .iter()
                .map(|(_, org, reference, _, ids)| broker.withdraw(org, reference, ids.clone())),
        )
        .await;
        for ((at, org, reference, level, _), result) in withdrawals.iter().zip(results) {
            match result {
                Ok(cancelled) if !cancelled.is_empty() => {
                    info!(organisation = %org, object = %reference, level, tasks = cancelled.len(), "the object's scan level dropped below its waiting tasks' boefjes: they are cancelled");
                }
                Ok(_) => {}
                Err(e) => {
                    if let Some(e) = crate::planner::PlanError::of_push(e) {
                        outcomes[*at] = Some(Outcome::of_plan(&Err(e)));
                    }
                }
            }
        }
    }

    /// Takes Octopoes' level of now for each of `lowered`, where it answers; an object it no
    /// longer holds is left to its delete event (which cancels all its work).
    async fn confirm_levels(&self, org: &str, lowered: &mut Vec<Lowered<'_>>) {
        let lookup = &self.planner.objects;
        if !lookup.asks_octopoes() {
            return;
        }
        let refs: Vec<String> = lowered.iter().map(|l| l.event.reference.clone()).collect();
        let budget = AtomicUsize::new(refs.len());
        let Ok(known) = lookup.confirmed(org, &refs, &budget).await else {
            // No answer: the event is Octopoes' own word, and no later one is known.
            return;
        };
        lowered.retain_mut(|l| match known.get(&l.event.reference) {
            Some(Known::Present(row)) => {
                if let Some(level) = row.scan_level {
                    l.level = level;
                }
                true
            }
            Some(Known::Gone) => false,
            _ => true,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boefje(id: &str, consumes: &str, level: Option<i64>) -> Plugin {
        serde_json::from_value(serde_json::json!({
            "id": id, "type": "boefje", "consumes": [consumes], "scan_level": level,
        }))
        .unwrap()
    }

    #[test]
    fn only_boefjes_of_the_type_needing_more_than_the_level_are_above_it() {
        let normalizer: Plugin = serde_json::from_value(serde_json::json!({
            "id": "n", "type": "normalizer", "consumes": ["Hostname"], "scan_level": 4,
        }))
        .unwrap();
        let plugins = [
            boefje("dns", "Hostname", Some(1)),
            boefje("intrusive", "Hostname", Some(3)),
            boefje("ports", "IPAddressV4", Some(3)),
            boefje("unlevelled", "Hostname", None),
            normalizer,
        ];
        assert_eq!(above(&plugins, "Hostname", 0), ["dns", "intrusive"]);
        assert_eq!(above(&plugins, "Hostname", 1), ["intrusive"]);
        assert!(above(&plugins, "Hostname", 3).is_empty());
    }
}
