//! The frontier: every object the scheduler plans work for, and the raw files it planned
//! normalizers for. This module is the only writer of the `frontier` and `raw_files` tables;
//! each write is an upsert that changes nothing when the same event comes twice.

pub mod lookup;

use std::collections::HashMap;

use chrono::NaiveDateTime;
use diesel::Connection;

use crate::domain::event::{ObjectEvent, ObjectState, Operation, RawFileEvent};
use crate::storage::frontier::{FrontierRow, ObjectRow, Progress};
use crate::storage::{self, DbPool, StorageError, frontier};

/// The frontier's writer.
#[derive(Clone)]
pub struct Frontier {
    pool: DbPool,
}

/// What an event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The frontier holds something new.
    Changed,
    /// It already held exactly this (a repeated event).
    Unchanged,
}

impl Frontier {
    /// The writer over `pool`.
    pub fn new(pool: DbPool) -> Self {
        Self { pool }
    }

    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut storage::AnyConnection) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        storage::run(&self.pool, f).await
    }

    /// Applies an object event: the object is upserted, or marked gone on a delete.
    pub async fn apply_object(
        &self,
        event: &ObjectEvent,
        now: NaiveDateTime,
    ) -> Result<Change, StorageError> {
        let (org, reference) = (event.organisation.clone(), event.reference.clone());
        let object = event.object.clone();
        let changed = self
            .write(move |c| {
                Ok(match object {
                    Some(o) => frontier::upsert_object(
                        c,
                        &org,
                        &reference,
                        &o.object_type,
                        o.scan_level,
                        o.scan_profile_type.as_deref(),
                        now,
                    )?,
                    None => frontier::mark_gone(c, &org, &reference, now)?,
                })
            })
            .await?;
        Ok(if changed {
            Change::Changed
        } else {
            Change::Unchanged
        })
    }

    /// Records a raw file.
    pub async fn record_raw_file(
        &self,
        event: &RawFileEvent,
        now: NaiveDateTime,
    ) -> Result<Change, StorageError> {
        let id = event.raw_id.to_string();
        let org = event.organisation.clone();
        let mime = serde_json::to_string(&event.mime_types).unwrap_or_default();
        let changed = self
            .write(move |c| Ok(frontier::record_raw_file(c, &id, &org, &mime, now)?))
            .await?;
        Ok(if changed {
            Change::Changed
        } else {
            Change::Unchanged
        })
    }

    /// Applies a batch of object events in one transaction: objects upserted, deleted ones
    /// marked gone. No two events of the batch may name the same object (the caller splits a
    /// batch where one repeats, so events apply in order). Their work is planned by the caller
    /// (the listener).
    pub async fn apply_objects(
        &self,
        events: &[&ObjectEvent],
        now: NaiveDateTime,
    ) -> Result<(), StorageError> {
        self.write_objects(events, now, true).await
    }

    /// Records Octopoes' answers to lookups as [`Frontier::apply_objects`] applies events, but as
    /// objects whose work nobody planned: a ColdStart pass plans a new or changed one as it would
    /// an object it found itself, not passing over a row that already matches Octopoes.
    pub async fn record_answers(
        &self,
        events: &[&ObjectEvent],
        now: NaiveDateTime,
    ) -> Result<(), StorageError> {
        self.write_objects(events, now, false).await
    }

    async fn write_objects(
        &self,
        events: &[&ObjectEvent],
        now: NaiveDateTime,
        planned: bool,
    ) -> Result<(), StorageError> {
        let mut upserts = Vec::new();
        let mut deletes = Vec::new();
        for e in events {
            match &e.object {
                Some(o) => upserts.push(object_row(&e.organisation, &e.reference, o)),
                None => deletes.push((e.organisation.clone(), e.reference.clone())),
            }
        }
        self.write(move |c| {
            c.transaction::<_, StorageError, _>(|c| {
                frontier::upsert_objects(c, &upserts, now, None, planned)?;
                for (org, reference) in &deletes {
                    frontier::mark_gone(c, org, reference, now)?;
                }
                Ok(())
            })
        })
        .await
    }

    /// Records a batch of raw files in one statement; answers how many were new.
    pub async fn record_raw_files(
        &self,
        events: &[&RawFileEvent],
        now: NaiveDateTime,
    ) -> Result<usize, StorageError> {
        let files: Vec<(String, String, String)> = events
            .iter()
            .map(|e| {
                (
                    e.raw_id.to_string(),
                    e.organisation.clone(),
                    serde_json::to_string(&e.mime_types).unwrap_or_default(),
                )
            })
            .collect();
        self.write(move |c| Ok(frontier::record_raw_files(c, &files, now)?))
            .await
    }

    /// Which of `objects` (of one organisation, as a ColdStart page lists them at `snapshot`)
    /// are new to the frontier, or back after being gone (creates), or changed type or scan
    /// profile (updates), or recorded from a lookup and never planned: the ones the page plans
    /// work for.
    ///
    /// A row written after `snapshot` (an event or a lookup since the pass began: a level
    /// lowered, the object deleted) is newer than the page and wins: such an object keeps its
    /// row's state in `objects` (the page's write then confirms it and changes nothing), and one
    /// gone since is taken out of `objects` and answered apart, to be confirmed as it is. A pass
    /// that resumes after days would otherwise write its old snapshot over everything since, and
    /// plan work at a level the user had taken back.
    pub async fn changed(
        &self,
        organisation: &str,
        objects: &mut Vec<(String, ObjectState)>,
        snapshot: NaiveDateTime,
    ) -> Result<(Vec<ObjectEvent>, Vec<String>), StorageError> {
        let org = organisation.to_owned();
        let references: Vec<String> = objects.iter().map(|(r, _)| r.clone()).collect();
        let known: HashMap<String, FrontierRow> = self
            .write(move |c| Ok(frontier::get_many(c, &org, &references)?))
            .await?
            .into_iter()
            .map(|r| (r.reference.clone(), r))
            .collect();
        let newer =
            |k: &FrontierRow| k.last_seen > snapshot || k.gone_at.is_some_and(|g| g > snapshot);
        let mut gone_since = Vec::new();
        objects.retain_mut(|(reference, state)| match known.get(reference.as_str()) {
            Some(k) if newer(k) && k.gone_at.is_some() => {
                gone_since.push(reference.clone());
                false
            }
            Some(k) if newer(k) => {
                *state = ObjectState {
                    object_type: k.object_type.clone(),
                    scan_level: k.scan_level,
                    scan_profile_type: k.scan_profile_type.clone(),
                };
                true
            }
            _ => true,
        });
        let mut seen = std::collections::HashSet::new();
        let events = objects
            .iter()
            .filter(|(reference, _)| seen.insert(reference.as_str()))
            .filter_map(|(reference, state)| {
                let operation = match known.get(reference) {
                    None => Operation::Create,
                    Some(k) if k.gone_at.is_some() => Operation::Create,
                    // Recorded from a lookup, never planned: new to the frontier then (first and
                    // last seen together), or changed.
                    Some(k) if !k.planned && k.first_seen == k.last_seen => Operation::Create,
                    Some(k) if !k.planned => Operation::Update,
                    Some(k)
                        if k.object_type != state.object_type
                            || k.scan_level != state.scan_level
                            || k.scan_profile_type != state.scan_profile_type =>
                    {
                        Operation::Update
                    }
                    Some(_) => return None,
                };
                Some(ObjectEvent {
                    operation,
                    organisation: organisation.to_owned(),
                    reference: reference.clone(),
                    object: Some(state.clone()),
                })
            })
            .collect();
        Ok((events, gone_since))
    }

    /// Loads one page of a ColdStart pass over `organisation` in one transaction: every object
    /// upserted and confirmed by the pass begun at `progress.pass_started_at`, the rows of
    /// `unreadable` (objects listed that could not be read) confirmed as they are, and the pass's
    /// progress saved with it, so a restart resumes after this page, never before it.
    pub async fn load_page(
        &self,
        organisation: &str,
        objects: Vec<(String, ObjectState)>,
        unreadable: Vec<String>,
        progress: Progress,
        now: NaiveDateTime,
    ) -> Result<(), StorageError> {
        // One row per object, the last the page lists (a page should not repeat one).
        let mut rows: Vec<ObjectRow> = Vec::with_capacity(objects.len());
        let mut at: HashMap<String, usize> = HashMap::new();
        for (reference, state) in objects {
            let row = object_row(organisation, &reference, &state);
            match at.get(&reference) {
                Some(&i) => rows[i] = row,
                None => {
                    at.insert(reference, rows.len());
                    rows.push(row);
                }
            }
        }
        self.write(move |c| {
            c.transaction::<_, StorageError, _>(|c| {
                frontier::upsert_objects(c, &rows, now, Some(progress.pass_started_at), true)?;
                frontier::confirm_objects(
                    c,
                    &progress.organisation,
                    &unreadable,
                    progress.pass_started_at,
                )?;
                frontier::progress_save(c, &progress, now)?;
                Ok(())
            })
        })
        .await
    }

    /// The objects of `organisation` a complete ColdStart pass begun at `pass_started` did not
    /// see: the candidates for gone, which only Octopoes can confirm
    /// ([`crate::storage::frontier::unseen_by_pass`]).
    pub async fn unseen_by_pass(
        &self,
        organisation: &str,
        pass_started: NaiveDateTime,
    ) -> Result<Vec<String>, StorageError> {
        let organisation = organisation.to_owned();
        self.write(move |c| Ok(frontier::unseen_by_pass(c, &organisation, pass_started)?))
            .await
    }

    /// Saves a pass's progress: each page's is saved with its objects; this one as a pass
    /// starts, and as it ends.
    pub async fn save_progress(
        &self,
        progress: Progress,
        now: NaiveDateTime,
    ) -> Result<(), StorageError> {
        self.write(move |c| Ok(frontier::progress_save(c, &progress, now)?))
            .await
    }

    /// Every organisation's ColdStart progress.
    pub async fn progress(&self) -> Result<Vec<Progress>, StorageError> {
        self.write(|c| Ok(frontier::progress_all(c)?)).await
    }

    /// The boefjes each organisation had enabled when last recorded.
    pub async fn enabled_boefjes(
        &self,
    ) -> Result<HashMap<String, std::collections::BTreeSet<String>>, StorageError> {
        self.write(|c| Ok(frontier::enabled_boefjes_all(c)?)).await
    }

    /// Records the boefjes `organisation` has enabled now.
    pub async fn record_enabled_boefjes(
        &self,
        organisation: &str,
        boefjes: std::collections::BTreeSet<String>,
        now: NaiveDateTime,
    ) -> Result<(), StorageError> {
        let organisation = organisation.to_owned();
        self.write(move |c| {
            Ok(frontier::enabled_boefjes_save(
                c,
                &organisation,
                &boefjes,
                now,
            )?)
        })
        .await
    }

    /// The frontier rows of `reference` in these organisations (not gone).
    pub async fn holders(
        &self,
        reference: &str,
        organisations: &[String],
    ) -> Result<Vec<FrontierRow>, StorageError> {
        let (reference, orgs) = (reference.to_owned(), organisations.to_vec());
        self.write(move |c| Ok(frontier::holders(c, &reference, &orgs)?))
            .await
    }

    /// The rows of `references` of `organisation` the frontier holds (gone ones too).
    pub async fn objects(
        &self,
        organisation: &str,
        references: &[String],
    ) -> Result<Vec<FrontierRow>, StorageError> {
        let (org, references) = (organisation.to_owned(), references.to_vec());
        self.write(move |c| Ok(frontier::get_many(c, &org, &references)?))
            .await
    }

    /// One object as the frontier holds it.
    pub async fn object(
        &self,
        organisation: &str,
        reference: &str,
    ) -> Result<Option<FrontierRow>, StorageError> {
        let (org, reference) = (organisation.to_owned(), reference.to_owned());
        self.write(move |c| Ok(frontier::get(c, &org, &reference)?))
            .await
    }
}

fn object_row(organisation: &str, reference: &str, o: &ObjectState) -> ObjectRow {
    ObjectRow {
        organisation: organisation.to_owned(),
        reference: reference.to_owned(),
        object_type: o.object_type.clone(),
        scan_level: o.scan_level,
        scan_profile_type: o.scan_profile_type.clone(),
    }
}
