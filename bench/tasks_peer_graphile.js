// Peer run for the leased tasks bench: graphile-worker, no-op jobs.
//   npm install --prefix /tmp/gw graphile-worker@0.17.3
//   NODE_PATH=/tmp/gw/node_modules node bench/tasks_peer_graphile.js DSN JOBS CONCURRENCY LOCAL_QUEUE_SIZE
// DSN must name an EMPTY database it may fill. LOCAL_QUEUE_SIZE 0 = no local queue.
// Prints one line of JSON: {"peer", "jobs", "seconds", "jobs_per_s"}.
const { run, makeWorkerUtils } = require("graphile-worker");

async function main() {
  const [dsn, jobsArg, concArg, lqArg] = process.argv.slice(2);
  const jobs = Number(jobsArg), concurrency = Number(concArg), localQueue = Number(lqArg);
  const utils = await makeWorkerUtils({ connectionString: dsn });
  await utils.migrate();
  await utils.withPgClient(async (client) => {
    for (let done = 0; done < jobs; done += 10000) {
      const n = Math.min(10000, jobs - done);
      await client.query(
        "select graphile_worker.add_jobs(array(select row('noop', '{}'::json, null, null, null, null, null, null)" +
        "::graphile_worker.job_spec from generate_series(1, $1)))", [n]);
    }
  });
  const preset = { worker: { completeJobBatchDelay: 0, failJobBatchDelay: 0 } };
  if (localQueue > 0) preset.worker.localQueue = { size: localQueue };
  const started = process.hrtime.bigint();
  const runner = await run({
    connectionString: dsn, concurrency, noHandleSignals: true, pollInterval: 100, preset,
    taskList: { noop: async () => {} },
  });
  let left = jobs;
  while (left > 0) {
    await new Promise((r) => setTimeout(r, 20));
    left = await utils.withPgClient(async (c) =>
      Number((await c.query("select count(*) as n from graphile_worker._private_jobs")).rows[0].n));
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await runner.stop();
  await utils.release();
  const version = require("graphile-worker/package.json").version;
  console.log(JSON.stringify({ peer: `graphile-worker ${version}` + (localQueue > 0 ? ` (local queue ${localQueue})` : ""),
                               jobs, seconds, jobs_per_s: jobs / seconds }));
}

main().catch((e) => { console.error(e); process.exit(1); });
