//! A queue engine's batch of pops and patches written on PostgreSQL as one autocommitted
//! statement with the multi-instance fence inside it (`storage::tasks::fenced`): what it writes
//! and answers, that a taken-over scheduler's batch writes nothing, and that a batch whose
//! connection broke is found written or not written on a fresh connection and never applied
//! twice.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use kat_scheduler::domain::{SchedulerId, TaskStatus};
use kat_scheduler::storage::rows::TaskRow;
use kat_scheduler::storage::tasks::fenced::{self, FencedWrite};
use kat_scheduler::storage::{self, DbTarget, StorageError, owners, tasks};

use crate::helpers::row_time as at;
use crate::helpers::*;

fn queued(n: usize) -> TaskRow {
    boefje_row(
        uuid::Uuid::new_v4().to_string(),
        n as i64,
        TaskStatus::Queued,
    )
}

/// A migrated database whose boefje scheduler `me` owns, with `n` queued tasks; the owner's epoch.
fn setup(uri: &str, n: usize) -> (storage::DbPool, i64, Vec<TaskRow>) {
    let pool = storage::connect(&DbTarget::parse(uri).unwrap(), 3, Duration::from_secs(5)).unwrap();
    let mut conn = storage::checkout(&pool).unwrap();
    storage::run_migrations(&mut conn).unwrap();
    let epoch = owners::claim(
        &mut conn,
        SchedulerId::Boefje,
        "me",
        "http://127.0.0.1:1",
        Duration::from_secs(600),
        None,
    )
    .unwrap();
    let owners::Claim::Taken(epoch) = epoch else {
        panic!("not taken: {epoch:?}")
    };
    let rows: Vec<TaskRow> = (0..n).map(queued).collect();
    tasks::insert(&mut conn, &rows).unwrap();
    (pool, epoch, rows)
}

/// Runs `test` on a fresh PostgreSQL database set up by [`setup`] with `n` tasks.
async fn on_postgres(
    n: usize,
    test: impl FnOnce(storage::DbPool, i64, Vec<TaskRow>) + Send + 'static,
) {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let uri = db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let (pool, epoch, rows) = setup(&uri, n);
        test(pool, epoch, rows);
    })
    .await
    .unwrap();
    drop(db);
}

/// `row` patched to `running` by a batch at `secs`.
fn running(row: &TaskRow, secs: i64) -> TaskRow {
    let mut r = row.clone();
    r.status = TaskStatus::Running;
    r.modified_at = at(secs);
    r
}

/// A batch of `me` under `epoch` at `secs`, its dispatched tasks leased until `lease_secs`.
fn batch<'a>(
    epoch: i64,
    updates: &'a [TaskRow],
    dispatched: &'a [String],
    secs: i64,
    lease_secs: Option<i64>,
) -> FencedWrite<'a> {
    FencedWrite {
        scheduler: SchedulerId::Boefje,
        instance: "me",
        epoch,
        updates,
        dispatched,
        taken_pending: &[],
        pending_rows: true,
        at: at(secs),
        lease: lease_secs.map(at),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_writes_pops_and_patches_and_a_fenced_one_writes_nothing() {
    on_postgres(4, |pool, epoch, rows| {
        let mut conn = storage::checkout(&pool).unwrap();
        // A patch of task 0 (queued → running, as a runner's PATCH of a popped task does) and
        // the pop of tasks 1 and 2.
        let mut running = running(&rows[0], 10);
        running.lease_expires_at = Some(at(70));
        let dispatched = vec![rows[1].id.clone(), rows[2].id.clone()];
        let w = batch(
            epoch,
            std::slice::from_ref(&running),
            &dispatched,
            10,
            Some(40),
        );
        assert!(w.fits());
        let written = fenced::write(&mut conn, &w).unwrap();
        let mut ids: Vec<&str> = written.iter().map(|r| r.id.as_str()).collect();
        ids.sort_unstable();
        let mut want: Vec<&str> = dispatched.iter().map(String::as_str).collect();
        want.sort_unstable();
        assert_eq!(ids, want, "the dispatched rows are answered");
        for r in &written {
            assert_eq!(r.status, TaskStatus::Dispatched);
            assert_eq!(r.modified_at, at(10));
            assert_eq!(r.lease_expires_at, Some(at(40)));
            assert!(
                r.data.contains("input_ooi"),
                "with their payload: {}",
                r.data
            );
        }
        let stored = tasks::get(&mut conn, &rows[0].id).unwrap().unwrap();
        assert_eq!(stored, running, "the patched row is written whole");
        assert_eq!(row_status(&mut conn, &rows[3].id), TaskStatus::Queued);
        assert!(
            tasks::queue_mismatches(&mut conn).unwrap().is_empty(),
            "task_queue in step: only task 3 waits"
        );
        assert_eq!(
            tasks::count_waiting(&mut conn, SchedulerId::Boefje, TaskStatus::Queued).unwrap(),
            1
        );

        // A heap task no longer queued is skipped, as a transition skips it: the answer holds
        // none, and the fence still held (no error).
        let again = vec![rows[1].id.clone()];
        let w = FencedWrite {
            updates: &[],
            dispatched: &again,
            at: at(11),
            ..w
        };
        assert!(fenced::write(&mut conn, &w).unwrap().is_empty());
        assert_eq!(
            tasks::get(&mut conn, &rows[1].id)
                .unwrap()
                .unwrap()
                .modified_at,
            at(10),
            "the skipped row is untouched"
        );

        // Another instance takes the scheduler: the former owner's batch writes nothing.
        let mut admin = storage::checkout(&pool).unwrap();
        admin
            .batch_execute(
                "UPDATE scheduler_owners SET owner = 'elsewhere', epoch = epoch + 1 \
                 WHERE scheduler_id = 'boefje'",
            )
            .unwrap();
        let mut done = rows[1].clone();
        done.status = TaskStatus::Completed;
        done.modified_at = at(12);
        let last = vec![rows[3].id.clone()];
        let w = FencedWrite {
            updates: std::slice::from_ref(&done),
            dispatched: &last,
            at: at(12),
            ..w
        };
        match fenced::write(&mut conn, &w) {
            Err(StorageError::Fenced(SchedulerId::Boefje)) => {}
            other => panic!("a fenced batch must be refused: {other:?}"),
        }
        assert_eq!(row_status(&mut conn, &rows[1].id), TaskStatus::Dispatched);
        assert_eq!(row_status(&mut conn, &rows[3].id), TaskStatus::Queued);
        assert!(tasks::queue_mismatches(&mut conn).unwrap().is_empty());
    })
    .await;
}

/// Pops of pending tasks straight from the backlog (perhaps from a read ahead half a second
/// old): each moved to `dispatched` with its queue row deleted, only while the table still holds
/// it pending; a row changed since is skipped and left as it is. Such a batch is told written or
/// not after a broken connection like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_tasks_popped_from_the_backlog_move_only_while_pending() {
    on_postgres(2, |pool, epoch, rows| {
        let mut conn = storage::checkout(&pool).unwrap();
        let pending: Vec<TaskRow> = (10..14)
            .map(|n| TaskRow {
                status: TaskStatus::Pending,
                ..queued(n)
            })
            .collect();
        tasks::insert(&mut conn, &pending).unwrap();
        assert!(tasks::queue_mismatches(&mut conn).unwrap().is_empty());
        let taken = vec![pending[0].id.clone(), pending[1].id.clone()];
        let dispatched = vec![rows[0].id.clone()];
        let w = FencedWrite {
            taken_pending: &taken,
            ..batch(epoch, &[], &dispatched, 30, Some(60))
        };
        assert!(w.fits());
        let written = fenced::write(&mut conn, &w).unwrap();
        let mut ids: Vec<&str> = written.iter().map(|r| r.id.as_str()).collect();
        ids.sort_unstable();
        let mut want = vec![rows[0].id.as_str(), taken[0].as_str(), taken[1].as_str()];
        want.sort_unstable();
        assert_eq!(ids, want, "the heap's task and the two pending ones");
        for r in &written {
            assert_eq!(r.status, TaskStatus::Dispatched);
            assert_eq!((r.modified_at, r.lease_expires_at), (at(30), Some(at(60))));
            assert!(r.data.contains("input_ooi"), "with their payload");
        }
        assert!(
            tasks::queue_mismatches(&mut conn).unwrap().is_empty(),
            "the popped tasks' queue rows deleted"
        );
        assert_eq!(
            tasks::count_waiting(&mut conn, SchedulerId::Boefje, TaskStatus::Pending).unwrap(),
            2
        );

        // Cancelled by hand since it was read: skipped, and left as the edit left it.
        conn.batch_execute(&format!(
            "UPDATE tasks SET status = 'cancelled' WHERE id = '{}'",
            pending[2].id
        ))
        .unwrap();
        let stale = vec![pending[2].id.clone()];
        let w2 = FencedWrite {
            taken_pending: &stale,
            ..batch(epoch, &[], &[], 31, Some(61))
        };
        assert!(fenced::write(&mut conn, &w2).unwrap().is_empty());
        assert_eq!(row_status(&mut conn, &pending[2].id), TaskStatus::Cancelled);

        // A pop of a pending task whose answer was lost with the connection: found written and
        // read back; one never sent: found not written, and written once.
        let mut fresh = storage::checkout(&pool).unwrap();
        let last = vec![pending[3].id.clone()];
        let w3 = FencedWrite {
            taken_pending: &last,
            ..batch(epoch, &[], &[], 32, Some(62))
        };
        assert!(!fenced::landed(&mut fresh, &w3).unwrap());
        let answered = fenced::recover(&mut fresh, &w3).unwrap();
        assert_eq!(answered.len(), 1);
        assert!(fenced::landed(&mut fresh, &w3).unwrap());
        assert_eq!(fenced::recover(&mut fresh, &w3).unwrap(), answered);
        assert_eq!(
            tasks::count_waiting(&mut fresh, SchedulerId::Boefje, TaskStatus::Pending).unwrap(),
            1,
            "only the queue row the edit left behind"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_connection_broke_is_found_written_or_written_once() {
    on_postgres(4, |pool, epoch, rows| {
        let mut first = storage::checkout(&pool).unwrap();
        let mut fresh = storage::checkout(&pool).unwrap();
        let running = running(&rows[0], 20);
        let dispatched = vec![rows[1].id.clone()];
        let w = batch(
            epoch,
            std::slice::from_ref(&running),
            &dispatched,
            20,
            Some(50),
        );
        // Not written yet (the statement never reached the server): found so, and written.
        assert!(!fenced::landed(&mut fresh, &w).unwrap());
        // Written, and its answer lost with the connection: found so on a fresh one, and the
        // dispatched row answered as written, without writing it again.
        let answered = fenced::write(&mut first, &w).unwrap();
        assert!(fenced::landed(&mut fresh, &w).unwrap());
        let recovered = fenced::recover(&mut fresh, &w).unwrap();
        assert_eq!(
            recovered, answered,
            "the answer read back is the one the write gave"
        );
        assert_eq!(recovered.len(), 1);

        let popped = vec![rows[2].id.clone()];
        let w2 = FencedWrite {
            updates: &[],
            dispatched: &popped,
            at: at(21),
            ..w
        };
        assert!(!fenced::landed(&mut fresh, &w2).unwrap());
        let written = fenced::recover(&mut fresh, &w2).unwrap();
        assert_eq!(written.len(), 1, "a batch found not written is written");
        assert_eq!(written[0].id, rows[2].id);
        assert_eq!(written[0].status, TaskStatus::Dispatched);
        assert!(fenced::landed(&mut fresh, &w2).unwrap());
        // Recovered twice (a second break): still one answer, nothing written twice.
        assert_eq!(fenced::recover(&mut fresh, &w2).unwrap(), written);
        assert!(tasks::queue_mismatches(&mut fresh).unwrap().is_empty());
        assert_eq!(
            tasks::count_waiting(&mut fresh, SchedulerId::Boefje, TaskStatus::Queued).unwrap(),
            1
        );

        // The connection broke before the batch was written, and meanwhile another instance
        // took the scheduler: what the engine believes it owns is out of date, so writing the
        // batch again must meet the fence and write nothing.
        fresh
            .batch_execute(
                "UPDATE scheduler_owners SET owner = 'elsewhere', epoch = epoch + 1 \
                 WHERE scheduler_id = 'boefje'",
            )
            .unwrap();
        let last = vec![rows[3].id.clone()];
        let w3 = batch(epoch, &[], &last, 22, Some(52));
        assert!(!fenced::landed(&mut fresh, &w3).unwrap());
        match fenced::recover(&mut fresh, &w3) {
            Err(StorageError::Fenced(SchedulerId::Boefje)) => {}
            other => panic!("a batch recovered after a takeover must be refused: {other:?}"),
        }
        assert_eq!(row_status(&mut fresh, &rows[3].id), TaskStatus::Queued);
        assert!(tasks::queue_mismatches(&mut fresh).unwrap().is_empty());
    })
    .await;
}

#[test]
fn only_batches_one_statement_can_write_take_that_path() {
    let a = queued(1);
    let changed = running(&a, 5);
    let other = vec![queued(2).id];
    let same = vec![a.id.clone()];
    let w = |updates: &[TaskRow], dispatched: &[String], secs: i64| {
        batch(1, updates, dispatched, secs, None).fits()
    };
    let one = std::slice::from_ref(&changed);
    assert!(w(one, &other, 5));
    assert!(!w(one, &same, 5), "a row on both sides");
    assert!(
        !w(one, &other, 6),
        "a changed row not stamped with the batch's time cannot be told written"
    );
    assert!(!w(&[], &[], 5), "nothing to write");
    let many: Vec<String> = (0..tasks::CHUNK + 1).map(|i| i.to_string()).collect();
    assert!(!w(&[], &many, 5), "more than one statement's chunk");
    let taken = |dispatched: &[String], pending: &[String]| {
        FencedWrite {
            taken_pending: pending,
            ..batch(1, &[], dispatched, 5, None)
        }
        .fits()
    };
    assert!(taken(&[], &other), "pops of pending tasks alone");
    assert!(
        !taken(&other, &other),
        "a task taken from the heap and from the backlog"
    );
    assert!(
        !taken(&[], &many),
        "more than one statement's chunk of pending tasks"
    );
}
