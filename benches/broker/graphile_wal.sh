#!/usr/bin/env bash
# Graphile Worker's write-ahead log per job on the same PostgreSQL server as `--wal`
# (benches/broker/wal.rs), read the same way: pg_waldump between marks, only the records of its own
# database (those naming its relations, and the commit records of their transactions).
#
#   benches/broker/graphile_wal.sh [JOBS]        # default 3000
#
# Installs graphile-worker from npm into a temporary directory (GRAPHILE_WORKER_VERSION, default
# 0.17.3), makes a database of its own, adds JOBS jobs from 16 connections (`add_job`, one commit
# each, as clients add them), then runs a worker (concurrency 16, a task that does nothing) until
# every job is done. Prints the bytes per job of each step, with and without full-page images.
# Needs psql, npm and node, and read access to the server's pg_wal (run as its owner or root);
# PG (default postgresql://postgres@127.0.0.1:5432) names the server, WALDIR its pg_wal.
set -euo pipefail

JOBS=${1:-3000}
PG=${PG:-postgresql://postgres@127.0.0.1:5432}
VERSION=${GRAPHILE_WORKER_VERSION:-0.17.3}
DB=kat_bench_graphile_$$
SLOT=kat_bench_graphile_$$
DIR=$(mktemp -d)
MAJOR=$(psql "$PG/postgres" -qAtc "SELECT current_setting('server_version_num')::int / 10000")
WALDUMP=$(command -v pg_waldump || echo "/usr/lib/postgresql/$MAJOR/bin/pg_waldump")
WALDIR=${WALDIR:-$(psql "$PG/postgres" -qAtc "SHOW data_directory")/pg_wal}

cleanup() {
    psql "$PG/postgres" -qAtc "SELECT pg_drop_replication_slot('$SLOT')" >/dev/null 2>&1 || true
    psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT

psql "$PG/postgres" -qc "CREATE DATABASE $DB"
URL="$PG/$DB"
(cd "$DIR" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund "graphile-worker@$VERSION" >/dev/null)
(cd "$DIR" && npx graphile-worker -c "$URL" --schema-only >/dev/null)
# A checkpoint may recycle the log before it is read: the slot holds it.
psql "$URL" -qAtc "SELECT pg_create_physical_replication_slot('$SLOT', true)" >/dev/null
OID=$(psql "$URL" -qAtc "SELECT oid FROM pg_database WHERE datname = current_database()")

cat >"$DIR/run.js" <<'JS'
const { run } = require("graphile-worker");
const pg = require("pg");
const url = process.env.URL;
const n = Number(process.env.JOBS);
// The payload of the broker's bench pushes (benches/broker/harness/http.rs), to be fair.
const payload = {
  boefje: { id: "push-0-0-0", oci_image: "ghcr.io/minvws/openkat/bench:latest" },
  input_ooi: "Hostname|internet|push-0-0-0.example.com",
  organization: "bench-push",
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
(async () => {
  const pool = new pg.Pool({ connectionString: url, max: 20 });
  const lsn = async () =>
    (await pool.query("SELECT pg_current_wal_insert_lsn()::text AS l")).rows[0].l;
  await pool.query("CHECKPOINT");
  const marks = [await lsn()];
  let next = 0;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < n) {
        next++;
        await pool.query("SELECT graphile_worker.add_job('noop', $1::json)", [
          JSON.stringify(payload),
        ]);
      }
    }),
  );
  marks.push(await lsn());
  let done = 0;
  const runner = await run({
    pgPool: pool,
    concurrency: 16,
    noHandleSignals: true,
    pollInterval: 100,
    logger: undefined,
    taskList: { noop: async () => { done++; } },
  });
  // Done once the last completion is committed: no job left.
  for (;;) {
    const left = (await pool.query("SELECT count(*)::int AS c FROM graphile_worker.jobs")).rows[0].c;
    if (done >= n && left === 0) break;
    await sleep(50);
  }
  marks.push(await lsn());
  await runner.stop();
  await pool.end();
  console.log(marks.join(" "));
})().catch((e) => { console.error(e); process.exit(1); });
JS

read -r -a MARKS < <(cd "$DIR" && URL="$URL" JOBS="$JOBS" node run.js 2>/dev/null | tail -1)
"$WALDUMP" -p "$WALDIR" -s "${MARKS[0]}" -e "${MARKS[2]}" 2>/dev/null |
    python3 -c '
import re, sys
oid, jobs, marks = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def lsn(s):
    hi, lo = s.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)
bounds = [lsn(m) for m in marks]
steps = [[0, 0] for _ in bounds[1:]]
xids = set()
for line in sys.stdin:
    m = re.search(r"len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+), lsn: ([0-9A-F]+/[0-9A-F]+)", line)
    if not m:
        continue
    rec, tot, xid, at = int(m[1]), int(m[2]), int(m[3]), lsn(m[4])
    k = next((i for i in range(len(steps)) if bounds[i] <= at < bounds[i + 1]), None)
    if k is None:
        continue
    r = re.search(r"rel \d+/(\d+)/\d+", line)
    if r:
        if r[1] != oid:
            continue
        xids.add(xid)
    elif not (xid and xid in xids):
        continue
    steps[k][0] += tot
    steps[k][1] += tot - rec if "FPW" in line else 0
names = ["add_job", "work and complete"]
for name, (b, f) in zip(names, steps):
    print(f"graphile-worker {name}: {b / jobs:.0f} B per job ({(b - f) / jobs:.0f} without full-page images)")
b = sum(s[0] for s in steps); f = sum(s[1] for s in steps)
print(f"graphile-worker, a job'"'"'s whole life: {b / jobs:.0f} B per job ({(b - f) / jobs:.0f} without full-page images)")
' "$OID" "$JOBS" "${MARKS[@]}"
