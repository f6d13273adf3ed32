// Peer runner of `pyscheduler bench peers`: graphile-worker (npm, bench/peers/package.json).
//   node bench/peers/graphile_worker.js DSN JOBS CONCURRENCY SAMPLES GAP_MS MAX_SECONDS
// Settings (worker.graphile.org/docs/performance): concurrency CONCURRENCY, a local queue
// of 500 jobs, completions batched (completeJobBatchDelay 0), LISTEN/NOTIFY; jobs added
// 10,000 per add_jobs call.
const { run, makeWorkerUtils } = require("graphile-worker");
const { Counter, main, report, runPhases } = require("./common");

const LOCAL_QUEUE = 500;

main(async (a) => {
  const counter = new Counter();
  const utils = await makeWorkerUtils({ connectionString: a.dsn });
  await utils.migrate();
  let enqueued = 0; // completed jobs are deleted: done = enqueued - left
  const query = (text, values) => utils.withPgClient((client) => client.query(text, values));
  const preset = { worker: { localQueue: { size: LOCAL_QUEUE }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } };
  const result = await runPhases(a, counter, {
    start: () => run({ connectionString: a.dsn, concurrency: a.concurrency, noHandleSignals: true, preset,
                       taskList: { noop: async (payload) => counter.handled(payload) } }),
    stop: (runner) => runner.stop(),
    enqueueOne: async (payload) => { enqueued += 1; await utils.addJob("noop", payload); },
    enqueueAll: async () => {
      for (let done = 0; done < a.jobs; done += 10000) {
        const n = Math.min(10000, a.jobs - done);
        await query("select graphile_worker.add_jobs(array(select row('noop', '{}'::json, null, null, null, null, " +
                    "null, null)::graphile_worker.job_spec from generate_series(1, $1)))", [n]);
        enqueued += n;
      }
      await query("analyze");
    },
    durable: async () => enqueued - Number((await query("select count(*) as n from graphile_worker._private_jobs")).rows[0].n),
  });
  await utils.release();
  report({ system: "graphile-worker", version: require("graphile-worker/package.json").version, ...result,
           settings: `concurrency ${a.concurrency}, localQueue ${LOCAL_QUEUE}, completeJobBatchDelay 0, LISTEN/NOTIFY` });
});
