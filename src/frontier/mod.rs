//! The frontier: every object the scheduler plans work for, and the raw files it planned
//! normalizers for. This module is the only writer of the `frontier` and `raw_files` tables;
//! each write is an upsert that changes nothing when the same event comes twice.

use chrono::NaiveDateTime;

use crate::domain::event::{ObjectEvent, RawFileEvent};
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
        let pool = self.pool.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = storage::checkout(&pool)?;
            f(&mut conn)
        })
        .await
        .map_err(|e| StorageError::Unavailable(format!("frontier write stopped: {e}")))?
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

    /// One object as the frontier holds it.
    pub async fn object(
        &self,
        organisation: &str,
        reference: &str,
    ) -> Result<Option<frontier::FrontierRow>, StorageError> {
        let (org, reference) = (organisation.to_owned(), reference.to_owned());
        self.write(move |c| Ok(frontier::get(c, &org, &reference)?))
            .await
    }
}
