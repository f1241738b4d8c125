// Graphile Worker's side of `--completions` (benches/broker/completions.rs, which writes this file
// beside its npm install of graphile-worker and runs it once per round with node).
//
// On a fresh database (URL): installs the schema, adds JOBS jobs in bulk, then runs the in-process
// pool (concurrency 16, a task that does nothing) and counts the jobs whose completion committed
// over SECONDS seconds after WARM_UP seconds of start-up. Graphile Worker deletes a job when it
// completes, so the count is the jobs left at the window's start minus those left at its end.
// Prints one line of `key=value` pairs on stdout; anything else goes to stderr.
const { run, makeWorkerUtils, Logger } = require("graphile-worker");

const url = process.env.URL;
const jobs = Number(process.env.JOBS);
const seconds = Number(process.env.SECONDS);
const warmUp = Number(process.env.WARM_UP);
// The payload of the broker's bench pushes (as graphile_wal.sh), to be fair.
const payload = {
  boefje: { id: "push-0-0-0", oci_image: "ghcr.io/minvws/openkat/bench:latest" },
  input_ooi: "Hostname|internet|push-0-0-0.example.com",
  organization: "bench-push",
};
// Warnings and errors only: the default logger writes a line per completed job, which the broker
// does not, and which would be console time measured as Graphile Worker's.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`graphile-worker ${level}: ${message}`);
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

(async () => {
  const utils = await makeWorkerUtils({ connectionString: url, logger });
  await utils.migrate();
  for (let added = 0; added < jobs; added += 5000) {
    const n = Math.min(5000, jobs - added);
    await utils.addJobs(Array.from({ length: n }, () => ({ identifier: "noop", payload })));
  }
  const left = async () =>
    Number(
      (await utils.withPgClient((c) => c.query("SELECT count(*) AS c FROM graphile_worker.jobs")))
        .rows[0].c,
    );
  // The seed's dirty pages are written before the pool starts, as on the broker's side.
  await utils.withPgClient((c) => c.query("CHECKPOINT"));
  let ran = 0;
  const runner = await run({
    connectionString: url,
    // One connection per worker and some for the runner's own queries (the default is 10).
    maxPoolSize: 20,
    concurrency: 16,
    noHandleSignals: true,
    pollInterval: 100,
    logger,
    taskList: { noop: async () => { ran++; } },
  });
  // A count and the moment it was taken (halfway through its query).
  const mark = async () => {
    const a = process.hrtime.bigint();
    const n = await left();
    return [n, Number(a + process.hrtime.bigint()) / 2e9];
  };
  await sleep(warmUp * 1000);
  const [before, t0] = await mark();
  await sleep(seconds * 1000);
  const [after, t1] = await mark();
  const window = t1 - t0;
  await runner.stop();
  const end = await left();
  const failed = Number(
    (
      await utils.withPgClient((c) =>
        c.query("SELECT count(*) AS c FROM graphile_worker.jobs WHERE last_error IS NOT NULL"),
      )
    ).rows[0].c,
  );
  await utils.release();
  console.log(
    `completed=${before - after} window_s=${window.toFixed(3)} ran=${ran} deleted=${jobs - end} left=${after} failed=${failed}`,
  );
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
