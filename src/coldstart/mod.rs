//! ColdStart: pages through every organisation's objects in Octopoes into the frontier, at start
//! and then periodically as a sanity check, and plans work for the objects that are new (or
//! changed) to the frontier.
//!
//! - **Started by cron.** The process runs a round when the boefje cron table's `coldstart`
//!   entry ([`crate::cron::coldstart`]) asks for one: at the first tick, then every minute
//!   while it is idle. A round runs here, off the table, so a long round does not hold up
//!   the table's other entries. With several instances on one database only the owner of the
//!   boefje scheduler ticks that table, so one instance pages Octopoes; should it lose the
//!   scheduler mid-round, its passes stop at the next page and the new owner resumes them.
//! - **Passes per organisation.** An organisation is due when it never had a complete pass, when
//!   its pass was interrupted (it resumes), or when its last pass completed `interval` ago. A
//!   round runs every due organisation, [`ColdStartConfig::concurrency`] at a time.
//! - **One snapshot.** A pass reads the objects as they were at its start (Octopoes'
//!   `valid_time`). That does not hold the listing still: normalizers write and delete objects
//!   at past valid times, and Octopoes orders the listing by type alone.
//! - **Resume, not restart.** Each page's objects and the pass's progress (next offset, snapshot,
//!   start) are committed in one transaction; after a restart the pass goes on at the next page.
//! - **Gone objects.** At the end of a complete pass, the organisation's objects the pass did not
//!   see (and that no event touched since it began) are asked of Octopoes; those it does not
//!   find are marked gone and their waiting tasks cancelled, those it still holds (moved onto a
//!   page already read) or cannot answer for are kept. Paging goes on while Octopoes' `count`
//!   says more follow, however short a page. An object listed but unreadable keeps its row
//!   when the listing names it; a pass that ended short of the count (an empty page), whose
//!   listing shrank while it paged, or that met an unreadable object without a reference asks
//!   nothing and marks nothing gone, and says so in a warning.
//! - **Failures stay local.** A page that fails is retried with backoff; after
//!   [`ColdStartConfig::attempts`] failures the organisation is left for the next round, with its
//!   progress kept, and the others go on. A page Octopoes fails for good with a server error is
//!   read in halves to find the objects it cannot list; the rest is loaded and the pass goes on
//!   (marking nothing gone).
//! - **Visible.** Progress (organisations done, objects loaded, rate, ETA) is logged every few
//!   seconds while a round runs and shown on `/health`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clients::http::ClientError;
use crate::clients::octopoes::{ObjectFilter, ObjectPage, Octopoes};
use crate::clock::SharedClock;
use crate::config;
use crate::domain::SchedulerId;
use crate::domain::event::{ObjectEvent, ObjectState, Operation};
use crate::domain::plugin::{Plugin, PluginType};
use crate::frontier::Frontier;
use crate::frontier::lookup::Known;
use crate::ownership::Ownership;
use crate::planner::{PlanError, Planner};
use crate::storage::StorageError;
use crate::storage::frontier::Progress;

/// How often a running round logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(5);
/// Objects the pass did not see asked of Octopoes per lookup: the lookup waits a few seconds
/// for its answers, a few calls at a time, so a long list goes in parts.
const CONFIRM_CHUNK: usize = 100;

/// What Octopoes said of the objects a pass did not see.
#[derive(Debug, Default)]
struct Unseen {
    /// Octopoes' own "not found": gone.
    gone: Vec<String>,
    /// Still there: the listing moved under the pass.
    held: usize,
    /// No answer: left for the next pass.
    unanswered: usize,
}

/// How ColdStart runs.
#[derive(Debug, Clone)]
pub struct ColdStartConfig {
    /// Time between two complete passes over an organisation.
    pub interval: Duration,
    /// Objects per page.
    pub page_size: u64,
    /// Organisations paged at once.
    pub concurrency: usize,
    /// Tries of one page before the organisation waits for the next round.
    pub attempts: u32,
    /// First wait after a failed page; doubles with each failure, to at most `max_backoff`.
    pub backoff: Duration,
    /// Longest wait between two tries of a page.
    pub max_backoff: Duration,
}

impl Default for ColdStartConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(config::DEFAULT_COLDSTART_INTERVAL_SECS),
            page_size: config::DEFAULT_COLDSTART_PAGE_SIZE,
            concurrency: config::DEFAULT_COLDSTART_CONCURRENCY,
            attempts: config::DEFAULT_COLDSTART_ATTEMPTS,
            backoff: Duration::from_millis(config::DEFAULT_COLDSTART_BACKOFF_MS),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// What `/health` shows of ColdStart.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ColdStartFigures {
    /// `off`, `idle` or `running`.
    pub state: String,
    /// Organisations in the current (or last) round.
    pub organisations: usize,
    /// Of those, the ones whose pass completed.
    pub organisations_done: usize,
    /// Of those, the ones left for the next round after failing.
    pub organisations_failed: usize,
    /// Objects loaded in this round.
    pub objects_loaded: u64,
    /// Objects the round's organisations hold, as far as their first pages said.
    pub objects_known: u64,
    /// Objects loaded per second in this round.
    pub rate_per_sec: f64,
    /// Seconds to go at that rate, for the objects known.
    pub eta_secs: Option<u64>,
    /// Tasks planned for new or changed objects in this round.
    pub tasks_planned: u64,
    /// Objects found gone in this round.
    pub objects_gone: u64,
    /// Rounds completed since start.
    pub rounds: u64,
    /// Tasks planned since start for boefjes enabled after ColdStart first saw their
    /// organisation, on objects no event announced.
    pub tasks_planned_for_new_boefjes: u64,
    /// Organisations that failed, with the last error.
    pub failures: Vec<String>,
    /// When the current (or last) round began.
    pub round_started_at: Option<DateTime<Utc>>,
}

/// ColdStart's state, shared with the API and tests.
#[derive(Debug)]
pub struct ColdStartStatus {
    figures: Mutex<ColdStartFigures>,
    loaded: AtomicU64,
    known: AtomicU64,
    planned: AtomicU64,
    gone: AtomicU64,
    new_boefjes: AtomicU64,
    round_began: Mutex<Option<Instant>>,
    /// Rounds completed; tests wait on it.
    rounds: watch::Sender<u64>,
    /// Times the process looked (a round asked for, whether or not anything was due).
    looks: watch::Sender<u64>,
    /// Starts a round (the cron entry).
    wake: Notify,
    /// Since when Octopoes calls have failed with no success in between, if they have.
    failing_since: Mutex<Option<DateTime<Utc>>>,
}

impl Default for ColdStartStatus {
    fn default() -> Self {
        Self {
            figures: Mutex::new(ColdStartFigures {
                state: "off".into(),
                ..ColdStartFigures::default()
            }),
            loaded: AtomicU64::new(0),
            known: AtomicU64::new(0),
            planned: AtomicU64::new(0),
            gone: AtomicU64::new(0),
            new_boefjes: AtomicU64::new(0),
            round_began: Mutex::new(None),
            rounds: watch::channel(0).0,
            looks: watch::channel(0).0,
            wake: Notify::new(),
            failing_since: Mutex::new(None),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ColdStartStatus {
    /// Since when ColdStart's calls have failed, with no success in between; `None` while they
    /// succeed.
    pub fn failing_since(&self) -> Option<DateTime<Utc>> {
        *lock(&self.failing_since)
    }

    fn call_failed(&self, now: DateTime<Utc>) {
        lock(&self.failing_since).get_or_insert(now);
    }

    fn call_succeeded(&self) {
        lock(&self.failing_since).take();
    }

    /// The figures now.
    pub fn figures(&self) -> ColdStartFigures {
        let mut f = lock(&self.figures).clone();
        f.objects_loaded = self.loaded.load(Ordering::Relaxed);
        f.objects_known = self.known.load(Ordering::Relaxed);
        f.tasks_planned = self.planned.load(Ordering::Relaxed);
        f.objects_gone = self.gone.load(Ordering::Relaxed);
        f.tasks_planned_for_new_boefjes = self.new_boefjes.load(Ordering::Relaxed);
        if let Some(began) = *lock(&self.round_began) {
            let secs = began.elapsed().as_secs_f64();
            if secs > 0.0 {
                f.rate_per_sec = (f.objects_loaded as f64 / secs * 10.0).round() / 10.0;
            }
            if f.state == "running" && f.rate_per_sec > 0.0 {
                let left = f.objects_known.saturating_sub(f.objects_loaded) as f64;
                f.eta_secs = Some((left / f.rate_per_sec).ceil() as u64);
            }
        }
        f
    }

    /// Asks the process for a round; it starts at once unless one is running, then after it.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Whether a round is running.
    pub fn running(&self) -> bool {
        lock(&self.figures).state == "running"
    }

    /// Waits until `n` rounds have completed since start (a test signal).
    pub async fn wait_rounds(&self, n: u64) {
        let mut rx = self.rounds.subscribe();
        let _ = rx.wait_for(|r| *r >= n).await;
    }

    /// Waits until the process has looked `n` times since start, a round or not (a test
    /// signal).
    pub async fn wait_looks(&self, n: u64) {
        let mut rx = self.looks.subscribe();
        let _ = rx.wait_for(|r| *r >= n).await;
    }

    fn begin_round(&self, organisations: usize, now: DateTime<Utc>) {
        for c in [&self.loaded, &self.known, &self.planned, &self.gone] {
            c.store(0, Ordering::Relaxed);
        }
        *lock(&self.round_began) = Some(Instant::now());
        let mut f = lock(&self.figures);
        *f = ColdStartFigures {
            state: "running".into(),
            organisations,
            rounds: f.rounds,
            round_started_at: Some(now),
            ..ColdStartFigures::default()
        };
    }

    fn end_round(&self) {
        {
            let mut f = lock(&self.figures);
            f.state = "idle".into();
            f.rounds += 1;
        }
        self.rounds.send_modify(|r| *r += 1);
    }
}

/// ColdStart and what it needs.
pub struct ColdStart {
    /// Where the objects come from.
    pub octopoes: Octopoes,
    /// Where they go.
    pub frontier: Frontier,
    /// What work new objects ask for (and the organisations, from its catalogue).
    pub planner: Planner,
    /// Decides what is due.
    pub clock: SharedClock,
    /// How it runs.
    pub config: ColdStartConfig,
    /// Its state, shared with the API.
    pub status: Arc<ColdStartStatus>,
    /// With several instances: pages only while this instance owns the boefje scheduler.
    pub ownership: Option<Arc<Ownership>>,
}

/// Why a step of a pass failed; it is tried again, and after
/// [`ColdStartConfig::attempts`] the organisation waits for the next round.
#[derive(Debug, thiserror::Error)]
pub enum ColdStartError {
    /// Octopoes did not give the page.
    #[error(transparent)]
    Octopoes(#[from] ClientError),
    /// The frontier could not be read or written.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The page's work could not be planned now (the catalogue or the queue cannot take it).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The service is stopping: what was begun is not finished.
    #[error("stopped")]
    Stopped,
}

/// Single objects a page's halving may find failing one after the other, with no answer in
/// between, before it takes Octopoes for failing at large ([`ColdStart::halves`]).
const HALVES_FAILING_IN_A_ROW: usize = 3;

/// Whether Octopoes answered a listing with the failure an object it cannot read gives it: a
/// 400 from its `ValueError` handler (the record fails its own model's validation, or names a
/// type it no longer has), or a 500 for anything else that breaks on the record. A 400 to a
/// request it cannot parse fails every part of a page alike, so the halving ends as Octopoes
/// failing at large.
fn refused_by_octopoes(e: &ClientError) -> bool {
    e.status().is_some_and(|s| s == 400 || s >= 500)
}

/// How one organisation's pass ended.
enum PassEnd {
    Complete,
    /// `what` failed (`the page at offset 2000`, `ending the pass`) with `error`.
    Failed {
        what: String,
        error: ColdStartError,
    },
    Stopped,
}

impl ColdStart {
    /// Runs a round whenever woken (by the cron entry), until `token` is cancelled.
    pub async fn run(self: Arc<Self>, token: CancellationToken) {
        lock(&self.status.figures).state = "idle".into();
        info!(
            interval_secs = self.config.interval.as_secs(),
            concurrency = self.config.concurrency,
            "ColdStart started"
        );
        loop {
            tokio::select! {
                () = token.cancelled() => break,
                () = self.status.wake.notified() => {}
            }
            // A round waiting on a hung Katalogus or Octopoes does not hold up a stop; each
            // page committed its checkpoint, so the next round resumes after it.
            tokio::select! {
                () = token.cancelled() => break,
                () = self.round(&token) => {}
            }
            self.status.looks.send_modify(|n| *n += 1);
        }
        lock(&self.status.figures).state = "off".into();
        info!("ColdStart stopped");
    }

    /// One round: every due organisation's pass, a few at a time.
    async fn round(&self, token: &CancellationToken) {
        let organisations = match self.planner.catalogue.organisations().await {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "ColdStart: no organisations to page yet");
                return;
            }
        };
        self.new_boefjes(&organisations, token).await;
        let progress: HashMap<String, Progress> = match self.frontier.progress().await {
            Ok(p) => p.into_iter().map(|p| (p.organisation.clone(), p)).collect(),
            Err(e) => {
                warn!(error = %e, "ColdStart: progress unreadable; trying again later");
                return;
            }
        };
        let now = self.clock.now();
        let interval =
            chrono::Duration::from_std(self.config.interval).unwrap_or(chrono::Duration::MAX);
        let due: Vec<(String, Option<Progress>)> = organisations
            .iter()
            .filter_map(|org| {
                let p = progress.get(org).cloned();
                let is_due = match &p {
                    None => true,
                    Some(p) => match p.completed_at {
                        None => true,
                        Some(done) => done.and_utc() + interval <= now,
                    },
                };
                is_due.then(|| (org.clone(), p))
            })
            .collect();
        if due.is_empty() {
            return;
        }
        let started = Instant::now();
        self.status.begin_round(due.len(), now);
        info!(organisations = due.len(), "ColdStart round started");
        let passes = futures_util::stream::iter(due)
            .map(|(org, p)| async move {
                let end = self.pass(&org, p, token).await;
                (org, end)
            })
            .buffer_unordered(self.config.concurrency.max(1));
        tokio::pin!(passes);
        let mut log_tick = tokio::time::interval(LOG_EVERY);
        log_tick.tick().await;
        loop {
            tokio::select! {
                next = passes.next() => {
                    let Some((org, end)) = next else { break };
                    let mut f = lock(&self.status.figures);
                    match end {
                        PassEnd::Complete => f.organisations_done += 1,
                        PassEnd::Failed { what, error } => {
                            f.organisations_failed += 1;
                            f.failures.push(format!("{org}: {what}: {error}"));
                        }
                        PassEnd::Stopped => {}
                    }
                }
                _ = log_tick.tick() => self.log_progress(),
            }
        }
        self.log_progress();
        let f = self.status.figures();
        info!(
            organisations_done = f.organisations_done,
            organisations_failed = f.organisations_failed,
            objects_loaded = f.objects_loaded,
            tasks_planned = f.tasks_planned,
            objects_gone = f.objects_gone,
            duration_ms = started.elapsed().as_millis() as u64,
            "ColdStart round ended"
        );
        self.status.end_round();
    }

    /// Boefjes enabled since ColdStart last looked (mula's `process_new_boefjes`), planned on
    /// the objects of each that Octopoes holds at a level it may scan. No event announces them:
    /// Octopoes publishes a change of scan profile only, and a boefje enabled in Rocky (after
    /// onboarding sets clearance on the first object, say) found nothing to plan when its events
    /// came. What each organisation has enabled is kept in `enabled_boefjes`; an organisation
    /// seen for the first time is recorded as it is (its objects are new to the frontier, so
    /// its first pass plans them whole). An organisation's record takes in the new boefjes that
    /// were planned: one Octopoes or the queue could not take stays out of it, and is tried
    /// again at the next round without holding the others up.
    async fn new_boefjes(&self, organisations: &[String], token: &CancellationToken) {
        if !self.owns_boefje() {
            return;
        }
        let recorded = match self.frontier.enabled_boefjes().await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "ColdStart: the boefjes enabled before are unreadable; new ones are looked for later");
                return;
            }
        };
        // The catalogue's copies (refreshed in the background), every organisation's at once:
        // one never fetched waits for Katalogus, and a Katalogus that hangs must cost the look
        // one wait, not one per organisation. A copy older than a boefje's enabling finds it at a
        // later look; one Katalogus could not give is looked at again then.
        let lists = futures_util::future::join_all(
            organisations
                .iter()
                .map(|org| self.planner.catalogue.plugins(org)),
        )
        .await;
        for (org, plugins) in organisations.iter().zip(lists) {
            if token.is_cancelled() {
                return;
            }
            let Ok(plugins) = plugins else {
                continue;
            };
            let enabled: std::collections::BTreeSet<String> = plugins
                .iter()
                .filter(|p| p.plugin_type == PluginType::Boefje && p.enabled)
                .map(|p| p.id.clone())
                .collect();
            let before = recorded.get(org);
            if before == Some(&enabled) {
                continue;
            }
            let new = before.map_or_else(Vec::new, |b| {
                plugins
                    .iter()
                    .filter(|p| enabled.contains(&p.id) && !b.contains(&p.id))
                    .collect()
            });
            // One boefje that cannot be planned (Octopoes refusing its listing) holds up neither
            // the others nor their record: it alone is left out, and so is new again next round.
            let mut recorded_now = enabled;
            for plugin in new {
                match self.plan_boefje(org, plugin, token).await {
                    Ok(n) => {
                        info!(organisation = %org, boefje = %plugin.id, tasks = n, "ColdStart: a boefje enabled since the last round is planned on the objects it may scan");
                    }
                    // Stopping: not recorded, so the next start plans it whole.
                    Err(ColdStartError::Stopped) => return,
                    Err(e) => {
                        warn!(organisation = %org, boefje = %plugin.id, error = %e, "ColdStart: a newly enabled boefje could not be planned; tried again next round");
                        recorded_now.remove(&plugin.id);
                    }
                }
            }
            if Some(&recorded_now) != before
                && let Err(e) = self
                    .frontier
                    .record_enabled_boefjes(org, recorded_now, self.clock.now().naive_utc())
                    .await
            {
                warn!(organisation = %org, error = %e, "ColdStart: the enabled boefjes could not be recorded; looked at again next round");
            }
        }
    }

    /// Plans `plugin` on every object of `org` Octopoes holds of a type it consumes, at a level
    /// it may scan, page by page; answers the tasks planned.
    async fn plan_boefje(
        &self,
        org: &str,
        plugin: &Plugin,
        token: &CancellationToken,
    ) -> Result<u64, ColdStartError> {
        let Some(level) = plugin.scan_level.and_then(|l| u8::try_from(l).ok()) else {
            return Ok(0);
        };
        if plugin.consumes.is_empty() || level > 4 {
            return Ok(0);
        }
        let filter = ObjectFilter {
            types: plugin.consumes.clone(),
            scan_levels: (level..=4).collect(),
        };
        let valid_time = self.clock.now();
        let (mut offset, mut planned) = (0u64, 0u64);
        loop {
            // As a pass's page: tried again, and read around an object Octopoes cannot list.
            let page = match self.page(org, &filter, offset, valid_time, token).await {
                Ok(page) => page,
                Err(PassEnd::Failed { error, .. }) => return Err(error),
                Err(_) => return Err(ColdStartError::Stopped),
            };
            let read = (page.items.len() + page.rejected.len()) as u64;
            let events: Vec<ObjectEvent> = page
                .items
                .into_iter()
                .map(|o| ObjectEvent {
                    operation: Operation::Create,
                    organisation: org.to_owned(),
                    reference: o.reference,
                    object: Some(ObjectState {
                        object_type: o.object_type,
                        scan_level: o.scan_level,
                        scan_profile_type: o.scan_profile_type,
                    }),
                })
                .collect();
            let refs: Vec<&ObjectEvent> = events.iter().collect();
            let mut page_planned = 0u64;
            for (event, result) in refs
                .iter()
                .zip(self.planner.objects_for_boefje(&refs, &plugin.id).await)
            {
                match result {
                    Ok(n) => page_planned += n as u64,
                    Err(e @ PlanError::Passing(_)) => return Err(e.into()),
                    Err(PlanError::Refused(why)) => {
                        warn!(organisation = %org, object = %event.reference, boefje = %plugin.id, reason = %why, "ColdStart: work for an object refused; skipped");
                    }
                }
            }
            self.status
                .new_boefjes
                .fetch_add(page_planned, Ordering::Relaxed);
            planned += page_planned;
            // As a pass ends: only the count says whether more follow (Octopoes may answer
            // fewer than asked before the end); an empty page ends it too.
            if read == 0 || offset + read >= page.count {
                return Ok(planned);
            }
            offset += read;
        }
    }

    /// Whether this instance may page: always when it runs alone.
    fn owns_boefje(&self) -> bool {
        self.ownership
            .as_ref()
            .is_none_or(|o| o.epoch(SchedulerId::Boefje) != 0)
    }

    fn log_progress(&self) {
        let f = self.status.figures();
        info!(
            organisations = f.organisations,
            organisations_done = f.organisations_done,
            organisations_failed = f.organisations_failed,
            objects_loaded = f.objects_loaded,
            objects_known = f.objects_known,
            rate_per_sec = f.rate_per_sec,
            eta_secs = f.eta_secs,
            "ColdStart progress"
        );
    }

    /// One organisation's pass: a new one, or the interrupted one resumed.
    async fn pass(
        &self,
        org: &str,
        previous: Option<Progress>,
        token: &CancellationToken,
    ) -> PassEnd {
        let now = self.clock.now().naive_utc();
        let mut progress = match previous {
            Some(p) if p.completed_at.is_none() => {
                info!(organisation = %org, offset = p.next_offset, "ColdStart resumes an interrupted pass");
                p
            }
            _ => Progress {
                organisation: org.to_owned(),
                pass_started_at: now,
                valid_time: now,
                next_offset: 0,
                loaded: 0,
                total: None,
                completed_at: None,
            },
        };
        let mut counted_total = false;
        loop {
            if token.is_cancelled() {
                return PassEnd::Stopped;
            }
            if !self.owns_boefje() {
                info!(organisation = %org, offset = progress.next_offset, "ColdStart: another instance took the boefje scheduler; it resumes this pass");
                return PassEnd::Stopped;
            }
            let offset = u64::try_from(progress.next_offset).unwrap_or(0);
            let page = match self
                .page(
                    org,
                    &ObjectFilter::default(),
                    offset,
                    progress.valid_time.and_utc(),
                    token,
                )
                .await
            {
                Ok(page) => page,
                Err(end) => return end,
            };
            if !counted_total {
                // The objects of this pass still to load count towards the round's ETA.
                let left = page.count.saturating_sub(offset);
                self.status.known.fetch_add(left, Ordering::Relaxed);
                counted_total = true;
            }
            if let Some(first) = page.rejected.first() {
                warn!(organisation = %org, offset, rejected = page.rejected.len(), first = %first.why, "ColdStart: objects Octopoes listed that cannot be read were skipped; those it names keep their frontier rows");
            }
            // Only the count says whether more follow: Octopoes may answer fewer than asked (a
            // cap on `limit`) before the end. An empty page ends the pass too, or it would ask
            // for the same page for ever; short of the count, the pass did not see it all.
            let listed = (page.items.len() + page.rejected.len()) as u64;
            let last = listed == 0 || offset + listed >= page.count;
            // Octopoes holds the unreadable objects it names; their rows stay as they are.
            let unreadable: Vec<String> = page
                .rejected
                .into_iter()
                .filter_map(|r| r.reference)
                .collect();
            let objects: Vec<(String, ObjectState)> = page
                .items
                .into_iter()
                .map(|o| {
                    (
                        o.reference,
                        ObjectState {
                            object_type: o.object_type,
                            scan_level: o.scan_level,
                            scan_profile_type: o.scan_profile_type,
                        },
                    )
                })
                .collect();
            let loaded = objects.len() as u64;
            let mut next = progress.clone();
            next.next_offset = i64::try_from(offset + listed).unwrap_or(i64::MAX);
            // Both are confirmed; what neither holds leaves the pass unable to find objects gone.
            next.loaded += i64::try_from(objects.len() + unreadable.len()).unwrap_or(0);
            // A listing that shrank while the pass paged through it moved the objects after the
            // gap onto pages already read: some may have been passed over, and the pass can no
            // longer vouch for what it did not see. Its count is then kept unknown for the rest
            // of the pass (also across a restart), so the pass finds nothing gone.
            let shrank = offset > 0
                && progress
                    .total
                    .is_none_or(|t| i64::try_from(page.count).is_ok_and(|c| c < t));
            next.total = match shrank {
                true => None,
                false => i64::try_from(page.count).ok(),
            };
            if let Err(end) = self
                .load(org, objects, unreadable, next.clone(), token)
                .await
            {
                return end;
            }
            self.status.loaded.fetch_add(loaded, Ordering::Relaxed);
            progress = next;
            if last {
                break;
            }
        }
        let now = self.clock.now();
        progress.completed_at = Some(now.naive_utc());
        // Objects the pass did not confirm are only gone if it saw the whole listing and
        // confirmed every object in it; otherwise their waiting work would be cancelled for
        // objects Octopoes still holds. The next pass (after `interval`) looks again.
        let listed = progress.next_offset;
        if progress.total.is_none_or(|count| listed < count) || progress.loaded < listed {
            warn!(organisation = %org, listed, count = ?progress.total, unreadable_without_reference = listed - progress.loaded, "ColdStart: the pass did not see or could not confirm Octopoes' whole listing (count none: the listing shrank while it paged); nothing marked gone");
            if let Err(e) = self.frontier.save_progress(progress, now.naive_utc()).await {
                return PassEnd::Failed {
                    what: "ending the pass".to_owned(),
                    error: e.into(),
                };
            }
            return PassEnd::Complete;
        }
        // What the pass did not see is only a candidate: the listing can change under the
        // pass's snapshot without shrinking (Octopoes lists by type alone, and normalizers write
        // and delete at past valid times), moving an object onto a page already read. So each
        // is asked of Octopoes, at the time of asking, and only its "not found" marks the
        // object gone (recorded by the lookup) and cancels its waiting tasks.
        let unseen = match self
            .frontier
            .unseen_by_pass(org, progress.pass_started_at)
            .await
        {
            Ok(u) => u,
            Err(e) => {
                return PassEnd::Failed {
                    what: "reading the objects the pass did not see".to_owned(),
                    error: e.into(),
                };
            }
        };
        let verdicts = match self.ask_octopoes(org, &unseen).await {
            Ok(v) => v,
            Err(e) => {
                return PassEnd::Failed {
                    what: "asking Octopoes about the objects the pass did not see".to_owned(),
                    error: e.into(),
                };
            }
        };
        for reference in &verdicts.gone {
            // Not cancelled (the queue away, or a restart first), a gone object's waiting task
            // stays: a runner that pops it finds the object gone and fails it.
            if let Err(e) = self.planner.gone(org, reference).await {
                warn!(organisation = %org, object = %reference, error = %e, "ColdStart: a gone object's waiting tasks were not cancelled");
            }
        }
        if verdicts.held > 0 {
            warn!(organisation = %org, objects = verdicts.held, "ColdStart: objects the pass did not see are still in Octopoes (its listing changed while the pass paged); kept");
        }
        if verdicts.unanswered > 0 {
            warn!(organisation = %org, objects = verdicts.unanswered, "ColdStart: Octopoes could not say whether objects the pass did not see are gone; none of them marked gone, the next pass asks again");
        }
        if let Err(e) = self
            .frontier
            .save_progress(progress.clone(), now.naive_utc())
            .await
        {
            return PassEnd::Failed {
                what: "ending the pass".to_owned(),
                error: e.into(),
            };
        }
        self.status
            .gone
            .fetch_add(verdicts.gone.len() as u64, Ordering::Relaxed);
        info!(organisation = %org, objects = progress.loaded, gone = verdicts.gone.len(), "ColdStart pass complete");
        PassEnd::Complete
    }

    /// What Octopoes says now of `references` of `organisation`, which a pass did not see: a
    /// few at a time, so that a long list fits the lookup's window of waiting for answers.
    async fn ask_octopoes(&self, org: &str, references: &[String]) -> Result<Unseen, StorageError> {
        let mut out = Unseen::default();
        // Every one may be asked: the pass's own budget is the list.
        let budget = std::sync::atomic::AtomicUsize::new(references.len());
        for chunk in references.chunks(CONFIRM_CHUNK) {
            let known = self.planner.objects.confirmed(org, chunk, &budget).await?;
            for reference in chunk {
                match known.get(reference) {
                    Some(Known::Gone) => out.gone.push(reference.clone()),
                    Some(Known::Present(_)) => out.held += 1,
                    _ => out.unanswered += 1,
                }
            }
        }
        Ok(out)
    }

    /// Runs `op` until it succeeds, at most [`ColdStartConfig::attempts`] times with a growing
    /// backoff in between; then the organisation is left for the next round.
    async fn retried<T, F, Fut>(
        &self,
        org: &str,
        what: &str,
        token: &CancellationToken,
        mut op: F,
    ) -> Result<T, PassEnd>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ColdStartError>>,
    {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result = op().await;
            match &result {
                Ok(_) => self.status.call_succeeded(),
                Err(_) => self.status.call_failed(self.clock.now()),
            }
            match result {
                Ok(v) => return Ok(v),
                Err(e) if attempt >= self.config.attempts => {
                    warn!(organisation = %org, attempts = attempt, error = %e, "ColdStart: {what} failed; organisation left for the next round");
                    return Err(PassEnd::Failed {
                        what: what.to_owned(),
                        error: e,
                    });
                }
                Err(e) => {
                    warn!(organisation = %org, attempt, error = %e, "ColdStart: {what} failed; trying again");
                    let wait = self
                        .config
                        .backoff
                        .saturating_mul(2u32.saturating_pow(attempt - 1))
                        .min(self.config.max_backoff);
                    tokio::select! {
                        () = token.cancelled() => return Err(PassEnd::Stopped),
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// One page from Octopoes, tried again with backoff.
    async fn page(
        &self,
        org: &str,
        filter: &ObjectFilter,
        offset: u64,
        valid_time: DateTime<Utc>,
        token: &CancellationToken,
    ) -> Result<ObjectPage, PassEnd> {
        let what = format!("the page at offset {offset}");
        let failed = match self
            .retried(org, &what, token, || async {
                Ok(self
                    .octopoes
                    .objects_matching(org, filter, offset, self.config.page_size, valid_time)
                    .await?)
            })
            .await
        {
            Ok(page) => return Ok(page),
            Err(end) => end,
        };
        // Octopoes answers, but fails this page: one object it cannot read (a record its own
        // model refuses: a 400) fails the whole listing of its page, for good. Pages of halves find
        // it; the rest of the page is read, and the pass goes on past it.
        let PassEnd::Failed {
            error: ColdStartError::Octopoes(e),
            ..
        } = &failed
        else {
            return Err(failed);
        };
        if !refused_by_octopoes(e) || self.config.page_size == 1 {
            return Err(failed);
        }
        match self
            .halves(org, filter, offset, self.config.page_size, valid_time)
            .await
        {
            Ok(page) => {
                if let Some(first) = page.rejected.first() {
                    warn!(organisation = %org, offset, unlistable = page.rejected.len(), first = %first.why, "ColdStart: Octopoes fails to list objects of this page; read the rest of it around them");
                }
                Ok(page)
            }
            // Octopoes cannot list at all now: the page is not to blame.
            Err(_) => Err(failed),
        }
    }

    /// The objects `offset..offset+limit` of `org`, read in halves, each half once: a part that
    /// Octopoes refuses ([`refused_by_octopoes`]) is halved again, down to one object. A single object
    /// that fails while Octopoes answers for what follows it is rejected without a reference (so
    /// the pass marks nothing gone); failures that nothing answered after end the page before
    /// them (the next page starts there), or, with nothing read, are Octopoes failing at large.
    /// The count is the last answer's; the page ends at the first part short of its limit.
    async fn halves(
        &self,
        org: &str,
        filter: &ObjectFilter,
        offset: u64,
        limit: u64,
        valid_time: DateTime<Utc>,
    ) -> Result<ObjectPage, ClientError> {
        let mut out = ObjectPage {
            count: 0,
            items: Vec::new(),
            rejected: Vec::new(),
        };
        // Parts still to read, first one first.
        let mut parts = vec![(offset, limit)];
        // Single objects failed since the last answer: rejected once something after them is
        // answered. Past a few in a row, Octopoes is failing at large (a descent costs a request
        // per halving, not one for every object of the page).
        let mut failed: Vec<crate::clients::octopoes::Rejected> = Vec::new();
        let mut last_error = None;
        while let Some((at, n)) = parts.pop() {
            match self
                .octopoes
                .objects_matching(org, filter, at, n, valid_time)
                .await
            {
                Ok(page) => {
                    let short = ((page.items.len() + page.rejected.len()) as u64) < n;
                    out.count = page.count;
                    out.rejected.append(&mut failed);
                    out.items.extend(page.items);
                    out.rejected.extend(page.rejected);
                    if short {
                        break;
                    }
                }
                Err(e) if refused_by_octopoes(&e) => {
                    if n > 1 {
                        let first = n / 2;
                        parts.push((at + first, n - first));
                        parts.push((at, first));
                        continue;
                    }
                    failed.push(crate::clients::octopoes::Rejected {
                        reference: None,
                        why: format!("offset {at}: Octopoes fails to list it: {e}"),
                    });
                    last_error = Some(e);
                    if failed.len() > HALVES_FAILING_IN_A_ROW {
                        break;
                    }
                    if parts.is_empty() {
                        // The page's last part: the object after it tells a broken object
                        // from Octopoes failing from here on.
                        parts.push((at + 1, 1));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        match last_error {
            Some(e) if !failed.is_empty() && out.items.is_empty() && out.rejected.is_empty() => {
                Err(e)
            }
            _ => Ok(out),
        }
    }

    /// Plans work for the page's new and changed objects, then writes the page and the pass's
    /// progress in one transaction; tried again with backoff. Planning comes first: should the
    /// write fail, the page is loaded again and its (already waiting) work is not pushed twice;
    /// the other way round, a crash between the two would leave new objects without work.
    async fn load(
        &self,
        org: &str,
        objects: Vec<(String, ObjectState)>,
        unreadable: Vec<String>,
        progress: Progress,
        token: &CancellationToken,
    ) -> Result<(), PassEnd> {
        self.retried(org, "loading a page", token, || {
            self.try_load(org, objects.clone(), unreadable.clone(), progress.clone())
        })
        .await
    }

    async fn try_load(
        &self,
        org: &str,
        objects: Vec<(String, ObjectState)>,
        unreadable: Vec<String>,
        progress: Progress,
    ) -> Result<(), ColdStartError> {
        let (mut objects, mut unreadable) = (objects, unreadable);
        // Rows written since the pass's snapshot win over it; those gone since are confirmed as
        // they are, like the unreadable ones (`Frontier::changed`).
        let (changed, gone_since) = self
            .frontier
            .changed(org, &mut objects, progress.valid_time)
            .await?;
        unreadable.extend(gone_since);
        let events: Vec<&ObjectEvent> = changed.iter().collect();
        for (event, planned) in events.iter().zip(self.planner.objects(&events).await) {
            match planned {
                Ok(n) => {
                    self.status.planned.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e @ PlanError::Passing(_)) => return Err(e.into()),
                Err(PlanError::Refused(why)) => {
                    warn!(organisation = %org, object = %event.reference, reason = %why, "ColdStart: work for an object refused; skipped");
                }
            }
        }
        let now = self.clock.now().naive_utc();
        Ok(self
            .frontier
            .load_page(org, objects, unreadable, progress, now)
            .await?)
    }
}
