// Peer runner of `pyscheduler bench peers`: graphile-worker (npm, bench/peers/package.json).
//   node bench/peers/graphile_worker.js DSN JOBS CONCURRENCY SAMPLES GAP_MS MAX_SECONDS [SCENARIO]
// Settings (worker.graphile.org/docs/performance): concurrency CONCURRENCY, a local queue
// of 500 jobs, completions and failures batched (completeJobBatchDelay, failJobBatchDelay 0),
// LISTEN/NOTIFY, a logger that drops messages (a failed job is logged otherwise); jobs added
// 10,000 per add_jobs call, with run_at and max_attempts per job (the scenarios of common.js).
const { Logger, run, makeWorkerUtils } = require("graphile-worker");
const { Counter, SCENARIOS, main, report, runPhases } = require("./common");

const LOCAL_QUEUE = 500;
const quiet = new Logger(() => () => {});

main(async (a) => {
  const counter = new Counter();
  const utils = await makeWorkerUtils({ connectionString: a.dsn, logger: quiet });
  await utils.migrate();
  let enqueued = 0; // completed jobs are deleted: done = enqueued - left
  const query = (text, values) => utils.withPgClient((client) => client.query(text, values));
  const preset = { worker: { localQueue: { size: LOCAL_QUEUE }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } };
  // scenario fail: a failing job's first attempt throws (graphile-worker retries it after exp(1) s)
  const noop = async (payload, helpers) => {
    if (payload.f && helpers.job.attempts < 2) throw new Error("fails once");
    counter.handled(payload);
  };
  // the job_spec of each job: (identifier, payload, queue_name, run_at, max_attempts, job_key, priority, flags)
  const spec = {
    noop: "row('noop', '{}'::json, null, null, null, null, null, null)",
    fail: `row('noop', case when i % ${SCENARIOS.FAIL_EVERY} = 0 then '{"f": true}' else '{}' end::json, null, null, ` +
          `${SCENARIOS.MAX_ATTEMPTS}, null, null, null)`,
    delay: `row('noop', '{}'::json, null, case when i % ${SCENARIOS.DELAY_EVERY} = 1 ` +
           `then now() + interval '${SCENARIOS.DELAY_SECONDS} second' end, null, null, null, null)`,
  }[a.scenario];
  const result = await runPhases(a, counter, {
    start: () => run({ connectionString: a.dsn, concurrency: a.concurrency, noHandleSignals: true, preset,
                       logger: quiet, taskList: { noop } }),
    stop: (runner) => runner.stop(),
    enqueueOne: async (payload) => { enqueued += 1; await utils.addJob("noop", payload); },
    enqueueAll: async () => {
      for (let done = 0; done < a.jobs; done += 10000) {
        const n = Math.min(10000, a.jobs - done);
        await query(`select graphile_worker.add_jobs(array(select ${spec}::graphile_worker.job_spec ` +
                    "from generate_series($1::int, $2::int) i))", [done, done + n - 1]);
        enqueued += n;
      }
      await query("analyze");
    },
    durable: async () => enqueued - Number((await query("select count(*) as n from graphile_worker._private_jobs")).rows[0].n),
  });
  await utils.release();
  report({ system: "graphile-worker", version: require("graphile-worker/package.json").version, ...result,
           settings: `concurrency ${a.concurrency}, localQueue ${LOCAL_QUEUE}, completeJobBatchDelay 0, ` +
                     "failJobBatchDelay 0, LISTEN/NOTIFY" });
});
