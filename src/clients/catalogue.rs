//! The plugin catalogue: which organisations there are, which plugins each has enabled, what they
//! consume, and which organisations run a boefje with the same settings (de-duplication). It
//! comes from Katalogus, or from a static file standing in for it, so the whole flow from event
//! to task also runs on the embedded default with nothing else installed.
//!
//! Katalogus answers are cached per organisation for a TTL and refreshed in the background
//! ([`Catalogue::run_refresh`]), a few organisations at a time, each call bounded by the client's
//! timeout: one slow or failing organisation holds one slot and keeps its last known plugins; it
//! never stalls the others, nor the listener, which reads the cache. An organisation the cache
//! has never seen is fetched at once (one fetch at a time per organisation); when Katalogus
//! cannot answer, the caller gets an error it can retry.
//!
//! The static file:
//!
//! ```toml
//! organisations = ["org1", "org2"]  # optional: also every organisation named below
//!
//! [[plugins]]
//! id = "dns-records"
//! type = "boefje"             # boefje | normalizer
//! consumes = ["Hostname"]     # object types, or mime types for a normalizer
//! scan_level = 1
//! oci_image = "ghcr.io/minvws/openkat/dns-records:latest"
//! enabled = true
//! interval = 1440             # optional: minutes between runs on one object
//! cron = "0 3 * * *"          # optional
//! run_on = ["create"]         # optional: only after these operations
//! deduplicate = true          # optional: the organisations of this entry share its runs
//! organisations = ["org1"]    # optional: only these organisations (default: all)
//! ```

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use config::{Config, File, FileFormat};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::katalogus::Katalogus;
use crate::clock::SharedClock;
use crate::domain::plugin::{Plugin, PluginType};

/// Organisations refreshed at once by the background refresh.
const REFRESH_CONCURRENCY: usize = 8;
/// How long a caller waits for the first fetch of an organisation's plugins. A slower answer
/// still fills the cache when it comes; the caller is told to try again, so an organisation
/// Katalogus is slow on delays only its own events.
pub const MISS_WAIT: Duration = Duration::from_secs(2);
/// How long an organisation Katalogus does not list keeps its cached plugins after it was last
/// asked for.
const UNLISTED_KEPT: chrono::Duration = chrono::Duration::hours(1);

/// Why the catalogue cannot answer (for now): the caller retries later.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CatalogueError {
    /// Katalogus answered with an error, or could not be reached.
    #[error("the plugin catalogue is unavailable: {0}")]
    Failed(String),
    /// Katalogus has not answered within [`MISS_WAIT`]; the fetch goes on and fills the cache
    /// when it ends.
    #[error("the plugin catalogue is unavailable: {0}")]
    Unanswered(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogueFile {
    #[serde(default)]
    organisations: Vec<String>,
    #[serde(default)]
    plugins: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    #[serde(flatten)]
    plugin: Plugin,
    #[serde(default)]
    organisations: Option<Vec<String>>,
}

/// A catalogue read from a file at start.
#[derive(Debug, Default)]
pub struct StaticCatalogue {
    organisations: Vec<String>,
    entries: Vec<(Plugin, Option<Vec<String>>)>,
}

impl StaticCatalogue {
    /// Reads `path`; the error names the file and what is wrong.
    pub fn load(path: &Path) -> Result<Self, String> {
        let file: CatalogueFile = Config::builder()
            .add_source(File::from(path).format(FileFormat::Toml))
            .build()
            .and_then(Config::try_deserialize)
            .map_err(|e| format!("plugin catalogue {}: {e}", path.display()))?;
        let mut organisations: BTreeSet<String> = file.organisations.into_iter().collect();
        for e in &file.plugins {
            organisations.extend(e.organisations.iter().flatten().cloned());
        }
        Ok(Self {
            organisations: organisations.into_iter().collect(),
            entries: file
                .plugins
                .into_iter()
                .map(|e| (e.plugin, e.organisations))
                .collect(),
        })
    }

    /// How many plugins it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn covers(orgs: &Option<Vec<String>>, organisation: &str) -> bool {
        orgs.as_ref()
            .is_none_or(|o| o.iter().any(|x| x == organisation))
    }

    /// The plugins of `organisation`.
    pub fn plugins(&self, organisation: &str) -> Vec<Plugin> {
        self.entries
            .iter()
            .filter(|(_, orgs)| Self::covers(orgs, organisation))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// The organisations the file names.
    pub fn organisations(&self) -> Vec<String> {
        self.organisations.clone()
    }

    /// The other organisations whose entry for `boefje` is the one `organisation` has, when that
    /// entry is marked `deduplicate`: they run it with the same settings.
    pub fn duplicates(&self, organisation: &str, boefje: &str) -> Vec<String> {
        let Some((_, orgs)) = self.entries.iter().find(|(p, orgs)| {
            p.id == boefje
                && p.plugin_type == PluginType::Boefje
                && p.deduplicate
                && Self::covers(orgs, organisation)
        }) else {
            return Vec::new();
        };
        let members = orgs.as_ref().unwrap_or(&self.organisations);
        members
            .iter()
            .filter(|o| o.as_str() != organisation)
            .cloned()
            .collect()
    }
}

/// Where the catalogue comes from.
enum Source {
    File(StaticCatalogue),
    Katalogus(Katalogus),
}

/// A cached answer and when it was fetched.
struct Cached<T> {
    value: T,
    fetched: DateTime<Utc>,
}

/// What `/health` shows of the catalogue.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CatalogueStatus {
    /// `file`, `katalogus` or `none`.
    pub source: String,
    /// Organisations whose plugins are cached.
    pub organisations: usize,
    /// The last background refresh that completed, if any.
    pub last_refresh: Option<DateTime<Utc>>,
    /// Fetches that failed since start (the last known answer was kept).
    pub failures: u64,
    /// The last failure, if any.
    pub last_error: Option<String>,
    /// Since when Katalogus has failed without a complete refresh in between, if it has.
    pub failing_since: Option<DateTime<Utc>>,
}

/// A cached list of organisations.
type CachedList = Cached<Arc<[String]>>;

struct Inner {
    source: Source,
    ttl: chrono::Duration,
    clock: SharedClock,
    plugins: Mutex<HashMap<String, Cached<Arc<[Plugin]>>>>,
    organisations: Mutex<Option<Cached<Arc<[String]>>>>,
    duplicates: Mutex<HashMap<(String, String), CachedList>>,
    /// One fetch at a time per organisation: a burst of events for an organisation the cache
    /// has not seen costs one Katalogus call. An entry lives while a fetch runs or waits.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When each organisation Katalogus does not list was last asked for: its cached plugins
    /// are kept (and refreshed) only while it is asked for, so organisations deleted from
    /// Katalogus, or made up in pushes, do not pile up over an uptime.
    asked: Mutex<HashMap<String, DateTime<Utc>>>,
    status: Mutex<CatalogueStatus>,
}

/// The plugin catalogue, cached. Cheap to clone.
#[derive(Clone)]
pub struct Catalogue {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Catalogue {
    fn with(source: Source, ttl: Duration, clock: SharedClock, name: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                ttl: chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX),
                clock,
                plugins: Mutex::default(),
                organisations: Mutex::default(),
                duplicates: Mutex::default(),
                fetching: Mutex::default(),
                asked: Mutex::default(),
                status: Mutex::new(CatalogueStatus {
                    source: name.to_owned(),
                    ..CatalogueStatus::default()
                }),
            }),
        }
    }

    /// A catalogue with no plugins (nothing configured).
    pub fn empty(clock: SharedClock) -> Self {
        Self::with(
            Source::File(StaticCatalogue::default()),
            Duration::MAX,
            clock,
            "none",
        )
    }

    /// A catalogue from a static file.
    pub fn from_file(file: StaticCatalogue, clock: SharedClock) -> Self {
        Self::with(Source::File(file), Duration::MAX, clock, "file")
    }

    /// A catalogue from Katalogus, its answers cached for `ttl`.
    pub fn from_katalogus(client: Katalogus, ttl: Duration, clock: SharedClock) -> Self {
        Self::with(Source::Katalogus(client), ttl, clock, "katalogus")
    }

    /// Whether any source of plugins is configured: without one (no Katalogus, no file, or an
    /// empty file) the catalogue knows nothing, and a plugin it lacks is unknown, not gone.
    pub fn is_configured(&self) -> bool {
        match &self.inner.source {
            Source::Katalogus(_) => true,
            Source::File(f) => !f.is_empty(),
        }
    }

    /// Whether answers come from Katalogus (and so need the background refresh).
    pub fn is_remote(&self) -> bool {
        matches!(self.inner.source, Source::Katalogus(_))
    }

    fn fresh<T: Clone>(&self, c: &Cached<T>) -> Option<T> {
        (self.inner.clock.now() - c.fetched < self.inner.ttl).then(|| c.value.clone())
    }

    fn failed(&self, what: &str, e: &dyn std::fmt::Display) {
        let now = self.inner.clock.now();
        let mut s = lock(&self.inner.status);
        s.failures += 1;
        s.last_error = Some(format!("{what}: {e}"));
        s.failing_since.get_or_insert(now);
    }

    /// How long Katalogus has been failing (no complete refresh since its first failure);
    /// `None` while it answers.
    pub fn failing_for(&self) -> Option<chrono::Duration> {
        let since = lock(&self.inner.status).failing_since?;
        Some(self.inner.clock.now() - since)
    }

    /// The plugins of `organisation` (enabled or not; the planner checks): the cached list, also
    /// a stale one (the background refresh brings it up to date; planning does not wait for it),
    /// else a fetch waited for.
    pub async fn plugins(&self, organisation: &str) -> Result<Arc<[Plugin]>, CatalogueError> {
        self.plugins_as(organisation, true).await
    }

    /// The plugins of `organisation` as Katalogus answers now: the cached list while it is
    /// fresh, else a fetch waited for (never a stale copy). For what cannot be undone, such as
    /// disabling a schedule because its plugin is gone or disabled: a copy kept while
    /// Katalogus fails may predate the plugin's re-enabling, and the answer must come from
    /// Katalogus itself (an error while it cannot give one).
    pub async fn plugins_confirmed(
        &self,
        organisation: &str,
    ) -> Result<Arc<[Plugin]>, CatalogueError> {
        self.plugins_as(organisation, false).await
    }

    /// [`Self::plugins`], or with `stale_ok` false [`Self::plugins_confirmed`].
    async fn plugins_as(
        &self,
        organisation: &str,
        stale_ok: bool,
    ) -> Result<Arc<[Plugin]>, CatalogueError> {
        if let Source::File(f) = &self.inner.source {
            return Ok(f.plugins(organisation).into());
        }
        {
            let now = self.inner.clock.now();
            let mut asked = lock(&self.inner.asked);
            match asked.get_mut(organisation) {
                Some(t) => *t = now,
                None => {
                    asked.insert(organisation.to_owned(), now);
                }
            }
        }
        let cached = lock(&self.inner.plugins)
            .get(organisation)
            .map(|c| self.fresh(c).ok_or_else(|| c.value.clone()));
        match cached {
            Some(Ok(fresh)) => return Ok(fresh),
            Some(Err(stale)) if stale_ok => return Ok(stale),
            _ => {}
        }
        self.fetch_waiting(organisation).await
    }

    /// Fetches `organisation`'s plugins and waits for them at most [`MISS_WAIT`].
    async fn fetch_waiting(&self, organisation: &str) -> Result<Arc<[Plugin]>, CatalogueError> {
        // The fetch runs on its own, so it completes (and fills the cache) even when this
        // caller stops waiting for it.
        let me = self.clone();
        let org = organisation.to_owned();
        let fetch = tokio::spawn(async move { me.fetch_plugins(&org).await });
        match tokio::time::timeout(MISS_WAIT, fetch).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(CatalogueError::Failed(format!("the fetch stopped: {e}"))),
            Err(_) => Err(CatalogueError::Unanswered(format!(
                "Katalogus has not answered for organisation '{organisation}' within {} s; its plugins are still being fetched",
                MISS_WAIT.as_secs()
            ))),
        }
    }

    /// Fetches an organisation's plugins into the cache, one fetch at a time per organisation.
    async fn fetch_plugins(&self, organisation: &str) -> Result<Arc<[Plugin]>, CatalogueError> {
        let Source::Katalogus(client) = &self.inner.source else {
            return Err(CatalogueError::Failed("not from Katalogus".into()));
        };
        let gate = lock(&self.inner.fetching)
            .entry(organisation.to_owned())
            .or_default()
            .clone();
        let turn = gate.lock().await;
        let fresh = lock(&self.inner.plugins)
            .get(organisation)
            .and_then(|c| self.fresh(c));
        let result = match fresh {
            // Fetched while this call waited its turn.
            Some(v) => Ok(v),
            None => match client.plugins(organisation).await {
                Ok(plugins) => Ok(self.store_plugins(organisation, plugins)),
                Err(e) => {
                    self.failed(organisation, &e);
                    Err(CatalogueError::Failed(e.to_string()))
                }
            },
        };
        drop(turn);
        // The gate goes with the last fetch that held it (the map's and this call's own are the
        // only handles left): a later fetch makes a new one.
        let mut fetching = lock(&self.inner.fetching);
        if fetching
            .get(organisation)
            .is_some_and(|g| Arc::ptr_eq(g, &gate) && Arc::strong_count(g) <= 2)
        {
            fetching.remove(organisation);
        }
        result
    }

    fn store_plugins(&self, organisation: &str, plugins: Vec<Plugin>) -> Arc<[Plugin]> {
        let value: Arc<[Plugin]> = plugins.into();
        lock(&self.inner.plugins).insert(
            organisation.to_owned(),
            Cached {
                value: value.clone(),
                fetched: self.inner.clock.now(),
            },
        );
        value
    }

    /// Every organisation.
    pub async fn organisations(&self) -> Result<Arc<[String]>, CatalogueError> {
        let client = match &self.inner.source {
            Source::File(f) => return Ok(f.organisations().into()),
            Source::Katalogus(k) => k,
        };
        if let Some(c) = lock(&self.inner.organisations).as_ref()
            && let Some(v) = self.fresh(c)
        {
            return Ok(v);
        }
        match client.organisations().await {
            Ok(orgs) => {
                let value: Arc<[String]> = orgs.into_iter().map(|o| o.id).collect();
                *lock(&self.inner.organisations) = Some(Cached {
                    value: value.clone(),
                    fetched: self.inner.clock.now(),
                });
                Ok(value)
            }
            Err(e) => {
                self.failed("organisations", &e);
                match lock(&self.inner.organisations).as_ref() {
                    Some(c) => Ok(c.value.clone()),
                    None => Err(CatalogueError::Failed(e.to_string())),
                }
            }
        }
    }

    /// The other organisations that run `boefje` with the same settings as `organisation` (its
    /// de-duplication siblings); only asked for a boefje marked `deduplicate`.
    pub async fn duplicates(
        &self,
        organisation: &str,
        boefje: &str,
    ) -> Result<Arc<[String]>, CatalogueError> {
        let client = match &self.inner.source {
            Source::File(f) => return Ok(f.duplicates(organisation, boefje).into()),
            Source::Katalogus(k) => k,
        };
        let key = (organisation.to_owned(), boefje.to_owned());
        if let Some(c) = lock(&self.inner.duplicates).get(&key)
            && let Some(v) = self.fresh(c)
        {
            return Ok(v);
        }
        match client.duplicate_organisations(organisation, boefje).await {
            Ok(orgs) => {
                let value: Arc<[String]> = orgs
                    .into_iter()
                    .filter(|o| o.as_str() != organisation)
                    .collect();
                lock(&self.inner.duplicates).insert(
                    key,
                    Cached {
                        value: value.clone(),
                        fetched: self.inner.clock.now(),
                    },
                );
                Ok(value)
            }
            Err(e) => {
                self.failed(&format!("{organisation}/{boefje} duplicates"), &e);
                match lock(&self.inner.duplicates).get(&key) {
                    Some(c) => Ok(c.value.clone()),
                    None => Err(CatalogueError::Failed(e.to_string())),
                }
            }
        }
    }

    /// Refreshes every organisation's plugins once, a few at a time; one that
    /// fails keeps its last answer. Returns how many failed.
    pub async fn refresh(&self) -> usize {
        let Source::Katalogus(client) = &self.inner.source else {
            return 0;
        };
        // Organisations are read fresh: a new one is fetched before its first event.
        lock(&self.inner.organisations).take();
        let mut failed = 0;
        let listed: Option<BTreeSet<String>> = match self.organisations().await {
            Ok(all) => Some(all.iter().cloned().collect()),
            Err(e) => {
                failed += 1;
                warn!(error = %e, "catalogue refresh: organisations unavailable");
                None
            }
        };
        let now = self.inner.clock.now();
        let mut orgs: BTreeSet<String> = lock(&self.inner.plugins).keys().cloned().collect();
        if let Some(listed) = &listed {
            // An organisation Katalogus no longer lists is kept while it is asked for (its
            // objects' events, pushes); else forgotten, so deleted ones do not pile up.
            let mut asked = lock(&self.inner.asked);
            asked.retain(|_, at| now - *at < UNLISTED_KEPT);
            let keep = |org: &String| listed.contains(org) || asked.contains_key(org);
            orgs.retain(keep);
            lock(&self.inner.plugins).retain(|org, _| keep(org));
            orgs.extend(listed.iter().cloned());
        }
        let results: Vec<(String, Result<Vec<Plugin>, _>)> = futures_util::stream::iter(orgs)
            .map(|org| async move {
                let r = client.plugins(&org).await;
                (org, r)
            })
            .buffer_unordered(REFRESH_CONCURRENCY)
            .collect()
            .await;
        for (org, r) in results {
            match r {
                Ok(plugins) => {
                    self.store_plugins(&org, plugins);
                }
                Err(e) => {
                    failed += 1;
                    warn!(organisation = %org, error = %e, "catalogue refresh failed; keeping the last known plugins");
                    self.failed(&org, &e);
                }
            }
        }
        lock(&self.inner.duplicates).retain(|_, c| self.fresh(c).is_some());
        let mut s = lock(&self.inner.status);
        s.last_refresh = Some(self.inner.clock.now());
        s.organisations = lock(&self.inner.plugins).len();
        if failed == 0 {
            s.failing_since = None;
        }
        failed
    }

    /// Refreshes the cache every half TTL until `token` is cancelled (Katalogus only).
    pub async fn run_refresh(self, token: CancellationToken) {
        if !self.is_remote() {
            return;
        }
        let period = self
            .inner
            .ttl
            .to_std()
            .map(|t| t / 2)
            // The TTL came from a std `Duration`, so it is never negative and this never falls
            // back; the floor of a second keeps a tiny TTL from refreshing in a busy loop.
            .unwrap_or_default()
            .max(Duration::from_secs(1));
        info!(
            period_secs = period.as_secs(),
            "plugin catalogue refresh started"
        );
        loop {
            // A refresh waiting on a hung Katalogus does not hold up a stop.
            let failed = tokio::select! {
                () = token.cancelled() => break,
                failed = self.refresh() => failed,
            };
            if failed > 0 {
                warn!(failed, "plugin catalogue refreshed with failures");
            }
            tokio::select! {
                () = token.cancelled() => break,
                () = tokio::time::sleep(period) => {}
            }
        }
    }

    /// What `/health` shows.
    pub fn status(&self) -> CatalogueStatus {
        let mut s = lock(&self.inner.status).clone();
        if let Source::File(f) = &self.inner.source {
            s.organisations = f.organisations.len();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalogue.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn a_file_lists_plugins_for_all_or_some_organisations() {
        let (_dir, path) = file(
            r#"
organisations = ["org1"]

[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true

[[plugins]]
id = "kat_dns"
type = "normalizer"
consumes = ["boefje/dns-records"]
enabled = true
organisations = ["org2"]
"#,
        );
        let c = StaticCatalogue::load(&path).unwrap();
        assert_eq!(c.plugins("org1").len(), 1);
        assert_eq!(c.plugins("org2").len(), 2);
        assert_eq!(c.organisations(), vec!["org1", "org2"]);
        std::fs::write(&path, "[[plugins]]\nid = 3\n").unwrap();
        assert!(
            StaticCatalogue::load(&path)
                .unwrap_err()
                .contains("catalogue.toml")
        );
    }

    #[test]
    fn organisations_sharing_a_deduplicated_entry_are_each_others_duplicates() {
        let (_dir, path) = file(
            r#"
[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
deduplicate = true
organisations = ["org1", "org2", "org3"]

[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
organisations = ["org4"]

[[plugins]]
id = "nmap"
type = "boefje"
consumes = ["IPAddressV4"]
scan_level = 2
enabled = true
organisations = ["org1", "org2"]
"#,
        );
        let c = StaticCatalogue::load(&path).unwrap();
        assert_eq!(c.duplicates("org2", "dns-records"), vec!["org1", "org3"]);
        assert!(
            c.duplicates("org4", "dns-records").is_empty(),
            "its own entry: other settings"
        );
        assert!(c.duplicates("org1", "nmap").is_empty(), "not deduplicated");
    }

    /// A client of `stub` that tries each call once.
    fn tried_once(stub: &super::super::http::stub::Stub) -> Katalogus {
        Katalogus::new(&stub.base, Duration::from_secs(5))
            .unwrap()
            .with_backoff(super::super::http::Backoff {
                attempts: 1,
                base: Duration::from_millis(1),
                cap: Duration::from_millis(1),
            })
    }

    #[tokio::test]
    async fn katalogus_failing_is_timed_from_its_first_failure_until_a_refresh_succeeds() {
        use super::super::http::stub::Stub;
        use std::sync::atomic::{AtomicBool, Ordering};
        let up = Arc::new(AtomicBool::new(false));
        let answer = up.clone();
        let stub = Stub::start(move |s| {
            if !answer.load(Ordering::SeqCst) {
                return (500, r#"{"detail": "Internal Server Error"}"#.into());
            }
            match s.path.as_str() {
                "/v1/organisations" => (200, r#"{"org1": {"id": "org1", "name": "org1"}}"#.into()),
                _ => (200, "[]".into()),
            }
        });
        let clock = Arc::new(crate::clock::ManualClock::new(Utc::now()));
        let client = tried_once(&stub);
        let c = Catalogue::from_katalogus(client, Duration::from_secs(60), clock.clone());
        assert_eq!(c.failing_for(), None, "nothing failed yet");
        assert!(c.refresh().await > 0);
        assert_eq!(c.failing_for(), Some(chrono::Duration::zero()));
        clock.advance(chrono::Duration::minutes(6));
        assert!(c.refresh().await > 0);
        assert_eq!(
            c.failing_for(),
            Some(chrono::Duration::minutes(6)),
            "timed from the first failure"
        );
        up.store(true, Ordering::SeqCst);
        assert_eq!(c.refresh().await, 0);
        assert_eq!(c.failing_for(), None, "a complete refresh ends it");
    }

    #[tokio::test]
    async fn organisations_katalogus_no_longer_lists_are_forgotten_once_nothing_asks_for_them() {
        use super::super::http::stub::Stub;
        let stub = Stub::start(|s| match s.path.as_str() {
            "/v1/organisations" => (200, r#"{"org1": {"id": "org1", "name": "org1"}}"#.into()),
            _ => (200, "[]".into()),
        });
        let clock = Arc::new(crate::clock::ManualClock::new(Utc::now()));
        let c =
            Catalogue::from_katalogus(tried_once(&stub), Duration::from_secs(60), clock.clone());
        // Asked for: a listed organisation, a deleted one and one made up in a push.
        for org in ["org1", "deleted", "made-up"] {
            c.plugins(org).await.unwrap();
        }
        assert!(
            lock(&c.inner.fetching).is_empty(),
            "no gate outlives its fetch"
        );
        c.refresh().await;
        assert_eq!(lock(&c.inner.plugins).len(), 3, "asked for within the hour");
        // `deleted` is still asked for (its objects' events); `made-up` is not.
        clock.advance(chrono::Duration::minutes(50));
        c.plugins("deleted").await.unwrap();
        clock.advance(chrono::Duration::minutes(20));
        let before = stub.seen().len();
        c.refresh().await;
        let mut kept: Vec<String> = lock(&c.inner.plugins).keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, ["deleted", "org1"]);
        assert!(
            !stub.seen()[before..]
                .iter()
                .any(|s| s.path.contains("made-up")),
            "a forgotten organisation is not asked of Katalogus"
        );
    }
}
