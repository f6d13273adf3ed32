// graphile-worker's runner of `pyscheduler bench peers`' enqueue and end-to-end sections: the
// protocol of pyscheduler/bench/peers/flow_runner.py (read its docstring), in JavaScript.
//   node bench/peers/graphile_flow.js enqueue DSN BULK_JOBS SINGLE_JOBS CONCURRENCY
//   node bench/peers/graphile_flow.js e2e DSN RATE SECONDS CONCURRENCY
//   node bench/peers/graphile_flow.js capacity DSN BACKLOG SECONDS CONCURRENCY
//   node bench/peers/graphile_flow.js produce DSN RATE SECONDS [BACKLOG]  (the producer process)
//   node bench/peers/graphile_flow.js single DSN 0 0 CONCURRENCY  (slices of single adds on stdin's cue)
// Jobs are added as users add them: WorkerUtils.addJobs (1,000 per call) and addJob; the
// worker has graphile_worker.js's settings (worker.graphile.org/docs/performance).
const { spawn } = require("node:child_process");
const { performance } = require("node:perf_hooks");
const { Logger, run, makeWorkerUtils } = require("graphile-worker");
const { sleep } = require("./common");

const BULK = 1000;
const TICK_MS = 10;
const DRAIN_MS = 60000; // flow_runner.py DRAIN_SECONDS
const WARM_MS = 1000; // flow_runner.py WARM_SECONDS
const FEED_MS = 2; // flow_runner.py FEED
const LOCAL_QUEUE = 500;
const quiet = new Logger(() => () => {});
const version = require("graphile-worker/package.json").version;
// ms on a clock every process shares (performance.now() counts from its own process's start)
const now = () => performance.timeOrigin + performance.now();

async function enqueue(dsn, bulkJobs, singleJobs) {
  const utils = await makeWorkerUtils({ connectionString: dsn, logger: quiet });
  await utils.migrate();
  await utils.addJobs([{ identifier: "flow", payload: { i: -1 } }]);
  const bulkMs = [], singleMs = [];
  const t0 = performance.now();
  for (let first = 0; first < bulkJobs; first += BULK) {
    const specs = [];
    for (let i = first; i < Math.min(first + BULK, bulkJobs); i++) specs.push({ identifier: "flow", payload: { i } });
    const t = performance.now();
    await utils.addJobs(specs);
    bulkMs.push(performance.now() - t);
  }
  const bulkS = (performance.now() - t0) / 1000;
  for (let i = 0; i < singleJobs; i++) {
    const t = performance.now();
    await utils.addJobs([{ identifier: "flow", payload: { i } }]);
    singleMs.push(performance.now() - t);
  }
  await utils.release();
  return { bulk_s: bulkS, bulk_ms: bulkMs, single_ms: singleMs,
           settings: "WorkerUtils.addJobs (node-postgres pool)" };
}

// nearest rank, as bench/stats.py: the smallest value that 99 % of the values are at or below
function p99(values) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.ceil(0.99 * sorted.length) - 1];
}

async function e2e(dsn, rate, seconds, concurrency, backlog = 0) {
  const utils = await makeWorkerUtils({ connectionString: dsn, logger: quiet });
  await utils.migrate();
  const seen = [], latencies = [], starts = [];
  let last = null;
  const flow = async (payload) => {
    const t = now();
    seen.push(payload.i);
    latencies.push(t - payload.t);
    starts.push(t);
    last = t;
  };
  const preset = { worker: { localQueue: { size: LOCAL_QUEUE }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } };
  const runner = await run({ connectionString: dsn, concurrency, noHandleSignals: true, preset, logger: quiet,
                             taskList: { flow } });
  await sleep(1000); // listening
  // the producer, a process of its own (as an application's is); with a backlog, fed the jobs started
  const made = await new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [__filename, "produce", dsn, String(rate), String(seconds), String(backlog)],
                        { stdio: [backlog ? "pipe" : "ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d) => { out += d; });
    const feeder = backlog ? setInterval(() => child.stdin.write(`${seen.length}\n`), FEED_MS) : null;
    if (backlog) child.stdin.on("error", () => {}); // the producer exited meanwhile
    child.on("close", (code) => {
      if (feeder) clearInterval(feeder);
      if (code !== 0) reject(new Error(`the producer failed (exit ${code})`));
      else resolve(JSON.parse(out.trim().split("\n").pop()));
    });
  });
  const sent = made.submitted;
  const cap = performance.now() + DRAIN_MS;
  while (seen.length < sent && performance.now() < cap) await sleep(5);
  await runner.stop();
  await utils.release();
  const distinct = new Set(seen);
  let missing = 0;
  for (let i = 0; i < sent; i++) if (!distinct.has(i)) missing += 1;
  const begin = made.started + WARM_MS;
  const inWindow = starts.filter((t) => t >= begin && t < made.ended).length;
  return { submitted: sent, completed: seen.length, duplicates: seen.length - distinct.size, missing,
           exactly_once: missing === 0 && seen.length === sent, total_s: ((last ?? now()) - made.started) / 1000,
           // enqueue-to-start of the jobs submitted in the steady window (flow_runner.py _done), every job's p99
           latency_ms: latencies.filter((ms, i) => starts[i] - ms >= begin), every_p99_ms: p99(latencies),
           window_rate: made.ended > begin ? inWindow / ((made.ended - begin) / 1000) : 0,
           settings: `concurrency ${concurrency}, localQueue ${LOCAL_QUEUE}, completeJobBatchDelay 0; ` +
                     "producer WorkerUtils.addJobs" };
}

async function produce(dsn, rate, seconds, backlog) {
  const utils = await makeWorkerUtils({ connectionString: dsn, logger: quiet });
  let ran = 0; // with a backlog: the jobs started, a line at a time on stdin
  if (backlog) {
    let buffered = "";
    process.stdin.on("data", (d) => {
      const lines = (buffered + d).split("\n");
      buffered = lines.pop();
      if (lines.length) ran = Number(lines[lines.length - 1]);
    });
  }
  const started = now();
  let sent = 0;
  for (;;) {
    const elapsed = (now() - started) / 1000;
    if (elapsed >= seconds) break;
    const due = backlog ? Math.min(BULK, backlog - (sent - ran)) : Math.floor(rate * elapsed) - sent;
    if (due > 0) {
      const t = now(), specs = [];
      for (let i = sent; i < sent + due; i++) specs.push({ identifier: "flow", payload: { i, t } });
      await utils.addJobs(specs);
      sent += due;
    }
    if (backlog) await (due > 0 ? new Promise(setImmediate) : sleep(FEED_MS / 2));
    else await sleep(Math.max(0, TICK_MS - (now() - started - elapsed * 1000)));
  }
  const ended = now();
  if (backlog) process.stdin.destroy();
  await utils.release();
  return { submitted: sent, started, ended };
}

// single: flow_runner.py's slices (its docstring): "ready", then per line of stdin that many addJobs
// of one job and a line of their times (ms); stdin's end ends it
async function single(dsn) {
  const utils = await makeWorkerUtils({ connectionString: dsn, logger: quiet });
  await utils.migrate();
  await utils.addJobs([{ identifier: "flow", payload: { i: -1 } }]);
  const lines = require("node:readline").createInterface({ input: process.stdin });
  process.stdout.write("ready\n");
  let i = 0;
  for await (const line of lines) {
    const ms = [];
    for (let k = 0; k < Number(line); k++, i++) {
      const t = performance.now();
      await utils.addJobs([{ identifier: "flow", payload: { i } }]);
      ms.push(performance.now() - t);
    }
    process.stdout.write(JSON.stringify(ms) + "\n");
  }
  await utils.release();
  return {};
}

const [mode, dsn, a, b, extra] = process.argv.slice(2); // extra: CONCURRENCY, or produce's BACKLOG
({ e2e: () => e2e(dsn, Number(a), Number(b), Number(extra)),
   capacity: () => e2e(dsn, 0, Number(b), Number(extra), Number(a)),
   produce: () => produce(dsn, Number(a), Number(b), Number(extra || 0)),
   enqueue: () => enqueue(dsn, Number(a), Number(b)),
   single: () => single(dsn) })[mode]()
  // one line, possibly MBs: exit only once it is written (console.log then exit cuts it at 64 KiB)
  .then((result) => process.stdout.write(JSON.stringify({ system: "graphile-worker", version, ...result }) + "\n",
                                         () => process.exit(0)),
        (e) => { console.error(e); process.exit(1); });
