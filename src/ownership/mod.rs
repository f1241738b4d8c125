//! Ownership: which instance owns each scheduler's heap when several instances share one
//! PostgreSQL database (docs/ARCHITECTURE.md, "Several instances").
//!
//! Each scheduler has one lease row (`scheduler_owners`, [`crate::storage::owners`]). A thread
//! per scheduler, on a connection of its own (a busy pool must never delay a renewal), runs a
//! round every third of the lease: it renews the lease if this instance holds it, takes it over
//! if it lapsed or was released (raising the epoch, the fencing token), and reads who owns it,
//! with the address to forward its requests to. The threads are apart because a renewal waits
//! for its engine's batch (the fence below): one scheduler's long batch must not hold up the
//! others' renewals. The engines read their scheduler's epoch from
//! here before each batch and check it in the batch's own transaction, so an instance that lost
//! a lease, however late it notices, cannot commit under it.
//!
//! A clean shutdown takes no lease from the moment it begins, and releases the leases it holds
//! after the engines have finished, so another instance takes them on its next round. SQLite runs one instance: there is no `Ownership` at all, and a
//! lock file keeps a second instance off the same database file ([`SqliteLock`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::domain::{PerScheduler, SchedulerId};
use crate::storage::{self, AnyConnection, DbTarget, StorageError, owners};

/// Why ownership could not be set up: the SQLite lock, or the ownership thread. Each message
/// carries its cause, which is not reported again as `source()` (see [`StorageError`]).
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    /// The database's directory could not be created.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The lock file could not be opened.
    #[error("cannot open the lock file {}: {error}", path.display())]
    LockFile {
        /// The lock file.
        path: PathBuf,
        /// Why not.
        error: std::io::Error,
    },
    /// Another process holds the lock: a second instance on one SQLite file.
    #[error(
        "another kat-scheduler instance is using the SQLite database {} (its lock file {} is held); \
         SQLite serves one instance: stop the other one, or run several instances on PostgreSQL",
        database.display(),
        path.display()
    )]
    Locked {
        /// The database file.
        database: PathBuf,
        /// Its lock file.
        path: PathBuf,
    },
    /// The lock could not be taken for another reason than its holder.
    #[error("cannot lock {}: {error}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why not.
        error: std::io::Error,
    },
    /// The ownership thread could not be started.
    #[error("cannot start the ownership thread: {0}")]
    Thread(std::io::Error),
}

/// Why nobody serves a scheduler now (`/health`'s readiness): its requests would be answered 503
/// until one instance holds its lease and is known here as live.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unserved {
    /// No ownership round has read the lease rows yet.
    #[error("no owner yet: the first ownership round has not run")]
    NoRoundYet,
    /// The named instance holds a live lease this process does not serve under: its own name's
    /// (a predecessor's, or a lease just lost); the next round settles it.
    #[error("changing owner: {0} holds the lease and is not yet known as live here")]
    ChangingOwner(String),
    /// The last holder's lease ran out and no instance has taken it.
    #[error("no owner: the last lease lapsed and nobody has taken it yet")]
    Lapsed,
}

/// Who this instance is and how long its leases run.
#[derive(Debug, Clone)]
pub struct OwnershipConfig {
    /// This instance's name in the lease rows (unique per process).
    pub instance: String,
    /// Where other instances reach this one (`http://host:port`).
    pub address: String,
    /// How long a lease runs without renewal.
    pub lease: Duration,
}

/// Where a scheduler's pushes, pops and patches go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This instance owns the scheduler, under this epoch.
    Local(i64),
    /// Another live instance owns it; forward to this address.
    Remote(String),
    /// Nobody holds it right now (an owner died and its lease has not lapsed, or one is taking
    /// over): a command waits for the next owner a few seconds, then is answered 503 with a
    /// short `Retry-After`.
    Moving,
}

/// The owner of a scheduler as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The owning instance.
    pub instance: String,
    /// Its address.
    pub address: String,
    /// Its epoch.
    pub epoch: i64,
    /// Whether its lease ran when read.
    pub live: bool,
}

/// Ownership of the schedulers, shared by the engines, the broker and the ownership thread.
#[derive(Debug)]
pub struct Ownership {
    config: OwnershipConfig,
    /// The epoch under which this instance holds each scheduler; 0 when it does not.
    ours: PerScheduler<AtomicI64>,
    /// Each scheduler's owner at the last round.
    owners: RwLock<PerScheduler<Option<Owner>>>,
    /// Leases this instance took, per scheduler (its first and every later takeover).
    takeovers: PerScheduler<AtomicU64>,
    /// When this instance first read the lease rows, on the database's clock (seconds since the
    /// epoch): only a lease taken before then can be its own predecessor's.
    started: std::sync::OnceLock<f64>,
    /// Set when this instance begins to stop: from then on its rounds renew what it holds (its
    /// engines are still draining) and take nothing. A lease another instance released as it
    /// stopped would otherwise go to an instance that is itself stopping (a rolling restart, a
    /// scale-down), which would load the heap, hold the lease through its own drain and release
    /// it again, with the scheduler answered 503 meanwhile.
    stopping: std::sync::atomic::AtomicBool,
}

impl Ownership {
    /// Ownership for this instance; it holds nothing until its first round.
    pub fn new(config: OwnershipConfig) -> Self {
        Self {
            config,
            ours: PerScheduler::from_fn(|_| AtomicI64::new(0)),
            owners: RwLock::new(PerScheduler::from_fn(|_| None)),
            takeovers: PerScheduler::default(),
            started: std::sync::OnceLock::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// This instance is stopping: its rounds take no lease from now on (see `stopping`).
    pub fn stop_claiming(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// How long a lease runs without renewal.
    pub fn lease(&self) -> std::time::Duration {
        self.config.lease
    }

    /// This instance's name.
    pub fn instance(&self) -> &str {
        &self.config.instance
    }

    /// This instance's address.
    pub fn address(&self) -> &str {
        &self.config.address
    }

    /// The epoch under which this instance holds `s`; 0 when it does not.
    pub fn epoch(&self, s: SchedulerId) -> i64 {
        self.ours[s].load(Ordering::Acquire)
    }

    /// Leases of `s` this instance took so far.
    pub fn takeovers(&self, s: SchedulerId) -> u64 {
        self.takeovers[s].load(Ordering::Relaxed)
    }

    /// `s`'s owner as last read (this instance included).
    pub fn owner(&self, s: SchedulerId) -> Option<Owner> {
        self.owners
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[s]
            .clone()
    }

    /// Where `s`'s writes go now.
    pub fn route(&self, s: SchedulerId) -> Route {
        let epoch = self.epoch(s);
        if epoch > 0 {
            return Route::Local(epoch);
        }
        match self.owner(s) {
            Some(o) if o.live && o.instance != self.config.instance => Route::Remote(o.address),
            _ => Route::Moving,
        }
    }

    /// An engine found its epoch fenced off in the database: `s` is no longer ours under
    /// `epoch`. The next round reads the new owner.
    pub fn lost(&self, s: SchedulerId, epoch: i64) {
        if self.ours[s]
            .compare_exchange(epoch, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            warn!(scheduler.id = %s, epoch, "lease lost: another instance holds this scheduler now");
        }
    }

    /// One round over every scheduler: renew what is ours, take what is free, read the rest.
    /// Calls `changed` for each scheduler whose epoch here changed (taken or lost), so its
    /// engine acts at once. The start's first round; after it, each scheduler has its own
    /// ([`Self::round_of`], [`Self::spawn`]).
    pub fn round(
        &self,
        conn: &mut AnyConnection,
        changed: &dyn Fn(SchedulerId),
    ) -> Result<(), StorageError> {
        for s in SchedulerId::ALL {
            self.round_of(conn, s, changed)?;
        }
        Ok(())
    }

    /// `s`'s round: renew its lease if ours, take it if free, read its owner. Its renewal waits
    /// for its engine's batch (the batch holds the row `FOR SHARE`: the fence), so each
    /// scheduler's round runs apart: a batch that holds its row for longer than a lease (the
    /// rebuild of a million queued tasks takes about 3 s) delays that renewal alone, never
    /// another scheduler's, which would lapse and be taken over by another instance.
    pub fn round_of(
        &self,
        conn: &mut AnyConnection,
        s: SchedulerId,
        changed: &dyn Fn(SchedulerId),
    ) -> Result<(), StorageError> {
        let (me, address, lease) = (
            self.config.instance.as_str(),
            self.config.address.as_str(),
            self.config.lease,
        );
        let epoch = self.epoch(s);
        if epoch > 0 {
            if !owners::renew(conn, s, me, epoch, lease)? {
                self.lost(s, epoch);
                changed(s);
            }
        } else {
            let rows = owners::all(conn)?;
            // This instance's start on the database's clock: its first read (before any lease
            // it could have taken; none is older than an empty table).
            let started = *self
                .started
                .get_or_init(|| rows.first().map_or(f64::NEG_INFINITY, |r| r.read_at));
            let row = rows.into_iter().find(|r| r.scheduler_id == s.as_str());
            // A holder that took the lease after this instance started is alive, whatever its
            // name: two instances given one name (or containers alike in host name and process
            // id) would otherwise take each other's leases for ever.
            let taken_before_start = row
                .as_ref()
                .is_some_and(|r| r.acquired_at.is_none_or(|a| a < started));
            let holder = row
                .filter(|r| r.live)
                .and_then(|r| r.owner)
                .filter(|o| !o.is_empty());
            // A lease held by this instance's own dead predecessor (a restart of the same
            // instance) is taken at once rather than after it lapses. A lease another instance
            // holds is not tried: the attempt would lock its row and wait for the owner's batch,
            // and the owner's next batch would wait for it, every round.
            let predecessor = holder
                .as_ref()
                .filter(|h| taken_before_start && self.is_predecessor(h));
            if let Some(p) = predecessor {
                info!(scheduler.id = %s, predecessor = p, "the lease is held by this instance's own predecessor, which is gone; taking it at once");
            }
            if (holder.is_none() || predecessor.is_some()) && !self.stopping.load(Ordering::Acquire)
            {
                match owners::claim(conn, s, me, address, lease, predecessor.map(String::as_str))? {
                    owners::Claim::Taken(epoch) => {
                        self.ours[s].store(epoch, Ordering::Release);
                        self.takeovers[s].fetch_add(1, Ordering::Relaxed);
                        info!(scheduler.id = %s, epoch, instance = me, "lease taken: this instance owns the scheduler");
                        changed(s);
                    }
                    owners::Claim::Importing => {
                        warn!(scheduler.id = %s, "kat-scheduler import-mula is writing to the database; the scheduler is not served until it ends (answering 503)");
                    }
                    owners::Claim::Held => {}
                }
            }
        }
        let seen = owners::all(conn)?
            .into_iter()
            .find(|r| r.scheduler_id == s.as_str())
            .map(|r| Owner {
                instance: r.owner.unwrap_or_default(),
                address: r.address.unwrap_or_default(),
                epoch: r.epoch,
                live: r.live,
            });
        self.owners
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[s] = seen;
        Ok(())
    }

    /// Whether `owner` (a live lease's holder) is this instance's own predecessor, gone: the
    /// same configured name (`cluster.instance_id`, which survives a restart), or a default name
    /// ([`default_instance_name`]) of this host whose process no longer runs (or whose process
    /// id is this process's own: a container's process 1 after a restart). Taking a lease
    /// wrongly would cost a handover, never a double commit: the epoch fences the former holder.
    fn is_predecessor(&self, owner: &str) -> bool {
        if owner == self.config.instance {
            return true;
        }
        let Some((host, pid)) = parse_default_name(owner) else {
            return false;
        };
        if host != host_name() {
            return false;
        }
        let proc_fs = Path::new("/proc/self").exists();
        pid == std::process::id() || (proc_fs && !Path::new(&format!("/proc/{pid}")).exists())
    }

    /// Whether every scheduler can be served from here now: owned by this instance, or by
    /// another whose lease runs (requests are forwarded to it). Answers, per scheduler, who
    /// serves it, or why nobody does.
    pub fn readiness(&self) -> PerScheduler<Result<String, Unserved>> {
        PerScheduler::from_fn(|s| match self.route(s) {
            Route::Local(epoch) => Ok(format!("owned here (epoch {epoch})")),
            Route::Remote(address) => Ok(format!("owned by the instance at {address}")),
            Route::Moving => Err(match self.owner(s) {
                None => Unserved::NoRoundYet,
                Some(o) if o.live => Unserved::ChangingOwner(o.instance),
                Some(_) => Unserved::Lapsed,
            }),
        })
    }

    /// Releases every lease this instance holds (a clean shutdown, after the engines stopped).
    pub fn release_all(&self, conn: &mut AnyConnection) {
        for s in SchedulerId::ALL {
            let epoch = self.ours[s].swap(0, Ordering::AcqRel);
            if epoch == 0 {
                continue;
            }
            match owners::release(conn, s, &self.config.instance, epoch) {
                Ok(true) => info!(scheduler.id = %s, epoch, "lease released"),
                Ok(false) => {}
                Err(e) => {
                    warn!(scheduler.id = %s, error = %e, "lease not released; it lapses on its own")
                }
            }
        }
    }

    /// Starts the ownership threads, one per scheduler, each on a connection of its own to
    /// `target`: a round of its scheduler every third of the lease until the handle is stopped.
    pub fn spawn(
        self: &Arc<Self>,
        target: DbTarget,
        changed: Arc<dyn Fn(SchedulerId) + Send + Sync>,
    ) -> Result<OwnershipHandle, OwnershipError> {
        let mut threads = Vec::with_capacity(SchedulerId::ALL.len());
        for s in SchedulerId::ALL {
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let (me, target, changed) = (self.clone(), target.clone(), changed.clone());
            let join = std::thread::Builder::new()
                .name(format!("ownership-{s}"))
                .spawn(move || me.rounds_of(s, &target, &*changed, &stopped))
                .map_err(OwnershipError::Thread)?;
            threads.push((stop, join));
        }
        Ok(OwnershipHandle { threads })
    }

    /// `s`'s rounds until `stopped` says so, on a connection kept between rounds.
    fn rounds_of(
        &self,
        s: SchedulerId,
        target: &DbTarget,
        changed: &dyn Fn(SchedulerId),
        stopped: &std::sync::mpsc::Receiver<()>,
    ) {
        let every = self.config.lease / 3;
        let mut conn: Option<AnyConnection> = None;
        let mut failing_since: Option<Instant> = None;
        loop {
            let fresh = |conn: &mut Option<AnyConnection>| {
                storage::open(target).and_then(|c| self.round_of(conn.insert(c), s, changed))
            };
            let result = match conn.as_mut() {
                Some(c) => match self.round_of(c, s, changed) {
                    // The server closed the kept connection (a restart, an administrator): one
                    // more try on a new one, before the lease runs short.
                    Err(e) if e.is_connection_lost() => {
                        info!(scheduler.id = %s, error = %e, "the ownership connection was closed; reconnecting");
                        fresh(&mut conn)
                    }
                    other => other,
                },
                None => fresh(&mut conn),
            };
            match result {
                Ok(()) => {
                    if failing_since.take().is_some() {
                        info!(scheduler.id = %s, "ownership rounds work again");
                    }
                }
                Err(e) => {
                    conn = None;
                    if failing_since.is_none() {
                        failing_since = Some(Instant::now());
                        error!(scheduler.id = %s, error = %e, "ownership round failed; the lease is not renewed until the database answers");
                    }
                }
            }
            match stopped.recv_timeout(every) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
}

/// The running ownership threads.
pub struct OwnershipHandle {
    threads: Vec<(Sender<()>, JoinHandle<()>)>,
}

impl OwnershipHandle {
    /// Stops the rounds (the leases stay held until released or lapsed).
    pub fn stop(self) {
        for (stop, _) in &self.threads {
            let _ = stop.send(());
        }
        for (_, join) in self.threads {
            if join.join().is_err() {
                error!("an ownership thread panicked");
            }
        }
    }
}

/// A name for this process in the lease rows: host, process id and a random part, so a
/// restarted process never passes for its predecessor.
pub fn default_instance_name() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{}-{}-{}", host_name(), std::process::id(), &random[..8])
}

/// The host and process id of a [`default_instance_name`] (`host-pid-random`); `None` for a
/// configured name of another shape.
fn parse_default_name(name: &str) -> Option<(&str, u32)> {
    let mut parts = name.rsplitn(3, '-');
    let random = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    let host = parts.next()?;
    let shaped = random.len() == 8 && random.bytes().all(|b| b.is_ascii_hexdigit());
    (shaped && !host.is_empty()).then_some((host, pid))
}

/// This machine's host name (`HOSTNAME`, else `/etc/hostname`, else `localhost`).
pub fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// An exclusive lock on a SQLite database file, held for the life of the process: a second
/// instance on the same file refuses to start instead of splitting the heaps between two
/// processes that cannot fence each other.
#[derive(Debug)]
pub struct SqliteLock {
    _file: File,
    path: PathBuf,
}

/// How long [`SqliteLock::acquire`] waits for a holder to let go.
pub const LOCK_WAIT: Duration = Duration::from_secs(3);

impl SqliteLock {
    /// Takes the lock beside `database` (`<database>.lock`), waiting up to [`LOCK_WAIT`] for a
    /// holder to let go, or says who holds it. The wait covers a predecessor still exiting (a
    /// supervisor's quick restart) and a process that forked just before the holder let go: a
    /// child holds the lock's file until it executes its program, however briefly.
    pub fn acquire(database: &Path) -> Result<SqliteLock, OwnershipError> {
        Self::acquire_within(database, LOCK_WAIT)
    }

    /// [`Self::acquire`], waiting up to `wait`.
    pub fn acquire_within(database: &Path, wait: Duration) -> Result<SqliteLock, OwnershipError> {
        // The lock is taken before the database is opened, so it is the first thing to need the
        // database's directory.
        crate::storage::create_parent_dir(database)?;
        let mut name = database.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|error| OwnershipError::LockFile {
                path: path.clone(),
                error,
            })?;
        let until = Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(SqliteLock { _file: file, path }),
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < until => {
                    // Polling the lock a holder may let go of at any moment; flock has no wait
                    // with a bound.
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(OwnershipError::Locked {
                        database: database.to_owned(),
                        path,
                    });
                }
                Err(std::fs::TryLockError::Error(error)) => {
                    return Err(OwnershipError::Lock { path, error });
                }
            }
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_sqlite_file_is_refused_with_a_message_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("scheduler.db");
        let first = SqliteLock::acquire(&db).unwrap();
        let err = SqliteLock::acquire_within(&db, Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(err.contains("another kat-scheduler instance"), "{err}");
        assert!(err.contains("scheduler.db"), "{err}");
        drop(first);
        SqliteLock::acquire(&db).expect("free again once the first is gone");
    }

    /// A holder that lets go while the next one waits (a predecessor exiting, or a child
    /// forked just before and not yet running its program) does not keep it out.
    #[test]
    fn a_lock_let_go_while_the_next_one_waits_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("scheduler.db");
        let first = SqliteLock::acquire(&db).unwrap();
        let next = {
            let db = db.clone();
            std::thread::spawn(move || SqliteLock::acquire_within(&db, Duration::from_secs(30)))
        };
        // The holder lets go a moment later (the stimulus, not a wait for a state).
        std::thread::sleep(Duration::from_millis(300));
        drop(first);
        assert!(next.join().unwrap().is_ok());
    }

    #[test]
    fn the_lock_creates_the_directory_of_a_database_that_does_not_exist_yet() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("data/nested/scheduler.db");
        let lock = SqliteLock::acquire(&db).unwrap();
        assert!(lock.path().is_file(), "{}", lock.path().display());
        assert!(lock.path().ends_with("data/nested/scheduler.db.lock"));
    }

    fn ownership(instance: &str) -> Ownership {
        Ownership::new(OwnershipConfig {
            instance: instance.into(),
            address: "http://127.0.0.1:1".into(),
            lease: Duration::from_secs(2),
        })
    }

    #[test]
    fn an_instances_own_dead_predecessor_is_recognised_and_no_live_neighbour_is() {
        let host = host_name();
        let me = ownership(&default_instance_name());
        // A default name of this host whose process is gone (no process has id 4194304 + 1:
        // Linux's pid_max is at most 2^22).
        assert!(me.is_predecessor(&format!("{host}-4194305-0123abcd")));
        // This very process's id under another random part: a container's process 1 again.
        assert!(me.is_predecessor(&format!("{host}-{}-89abcdef", std::process::id())));
        // A process of this host that runs (process 1 always does): another live instance.
        if Path::new("/proc/1").exists() {
            assert!(!me.is_predecessor(&format!("{host}-1-0123abcd")));
        }
        // Another host, or a configured name of another instance.
        assert!(!me.is_predecessor("elsewhere-4194305-0123abcd"));
        assert!(!me.is_predecessor("scheduler-b"));
        // A configured name that survives a restart: the same name is the predecessor.
        assert!(ownership("scheduler-a").is_predecessor("scheduler-a"));
        assert_eq!(
            parse_default_name("my-host-name-42-0123abcd"),
            Some(("my-host-name", 42))
        );
        assert_eq!(parse_default_name("my-host-42-xyz"), None);
    }

    #[test]
    fn readiness_names_each_scheduler_nobody_serves() {
        let me = ownership("a");
        let before = me.readiness();
        assert!(before[SchedulerId::Boefje].is_err(), "no round yet");
        me.ours[SchedulerId::Boefje].store(3, Ordering::Release);
        *me.owners.write().unwrap() = PerScheduler::from_fn(|s| {
            Some(Owner {
                instance: if s == SchedulerId::Boefje { "a" } else { "b" }.into(),
                address: "http://b:8000".into(),
                epoch: 3,
                live: s != SchedulerId::Report,
            })
        });
        let r = me.readiness();
        assert_eq!(
            r[SchedulerId::Boefje].as_deref(),
            Ok("owned here (epoch 3)")
        );
        assert!(
            r[SchedulerId::Normalizer]
                .as_ref()
                .unwrap()
                .contains("http://b:8000")
        );
        assert_eq!(r[SchedulerId::Report], Err(Unserved::Lapsed));
        assert!(Unserved::Lapsed.to_string().contains("lapsed"));
    }

    #[test]
    fn routes_follow_the_epoch_and_the_last_read_owner() {
        let own = Ownership::new(OwnershipConfig {
            instance: "a".into(),
            address: "http://a".into(),
            lease: Duration::from_secs(3),
        });
        let s = SchedulerId::Boefje;
        assert_eq!(own.route(s), Route::Moving, "nobody known yet");
        own.owners.write().unwrap()[s] = Some(Owner {
            instance: "b".into(),
            address: "http://b".into(),
            epoch: 4,
            live: true,
        });
        assert_eq!(own.route(s), Route::Remote("http://b".into()));
        own.owners.write().unwrap()[s].as_mut().unwrap().live = false;
        assert_eq!(
            own.route(s),
            Route::Moving,
            "a lapsed owner is not forwarded to"
        );
        own.ours[s].store(5, Ordering::Release);
        assert_eq!(own.route(s), Route::Local(5));
        own.lost(s, 4);
        assert_eq!(own.epoch(s), 5, "losing an older epoch changes nothing");
        own.lost(s, 5);
        assert_eq!(own.route(s), Route::Moving);
    }
}
