// The runner protocol of `pyscheduler bench peers` for the Node.js peers: the same
// steps as pyscheduler/bench/peers/runner.py (read its docstring), in JavaScript.
//   node bench/peers/<peer>.js DSN JOBS CONCURRENCY SAMPLES GAP_MS MAX_SECONDS [SCENARIO]
// DSN names an EMPTY database the runner may fill. Prints one line of JSON. SCENARIO
// (noop, fail, delay) and its constants are those of runner.py.
const { performance } = require("node:perf_hooks");

const WARM_UP = 3;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The scenarios of runner.py: fail: job i fails its first attempt when i % FAIL_EVERY == 0
// (retried after e s, graphile-worker's fixed first backoff), jobs with max_attempts
// MAX_ATTEMPTS; delay: job i runs DELAY_SECONDS after its enqueue when i % DELAY_EVERY == 1.
const SCENARIOS = { FAIL_EVERY: 10, MAX_ATTEMPTS: 5, DELAY_EVERY: 2, DELAY_SECONDS: 1 };

function parseArgs(argv = process.argv.slice(2)) {
  const [dsn, jobs, concurrency, samples, gapMs, maxSeconds, scenario] = argv;
  if (scenario !== undefined && !["noop", "fail", "delay"].includes(scenario)) {
    throw new Error(`unknown scenario ${scenario}`);
  }
  return { dsn, jobs: Number(jobs), concurrency: Number(concurrency), samples: Number(samples),
           gapMs: Number(gapMs), maxSeconds: Number(maxSeconds), scenario: scenario || "noop" };
}

// Jobs whose handler ran, and enqueue-to-start latencies (ms) of the sample jobs.
class Counter {
  constructor() { this.value = 0; this.latencies = []; this.onStart = null; }

  handled(payload) {
    if (payload && payload.t !== undefined) {
      this.latencies.push(performance.now() - payload.t);
      if (this.onStart) { const resolve = this.onStart; this.onStart = null; resolve(); }
      return;
    }
    this.value += 1;
  }

  async sample(enqueueOne, samples, gapMs) {
    for (let i = 0; i < WARM_UP + samples; i++) {
      let timer;
      const started = new Promise((resolve, reject) => {
        this.onStart = resolve;
        timer = setTimeout(() => reject(new Error("a sample job did not start within 10 s")), 10000);
      });
      await enqueueOne({ t: performance.now() });
      await started;
      clearTimeout(timer);
      await sleep(gapMs);
    }
    const out = this.latencies.slice(WARM_UP);
    this.latencies = [];
    return out;
  }
}

// Every job has run (the counter) and is durably done (one count per 20 ms), or the cap.
async function finish(counter, a, started, durable) {
  const cap = started + a.maxSeconds * 1000;
  while (counter.value < a.jobs && performance.now() < cap) await sleep(5);
  while (performance.now() < cap) {
    const done = await durable();
    if (done >= a.jobs) return [done, (performance.now() - started) / 1000];
    await sleep(20);
  }
  return [await durable(), a.maxSeconds];
}

// The three steps: latency with idle workers, enqueue (timed), work (timed).
async function runPhases(a, counter, { start, stop, enqueueOne, enqueueAll, durable }) {
  let running = await start(true);
  let latencies;
  try {
    latencies = await counter.sample(enqueueOne, a.samples, a.gapMs);
  } finally {
    await stop(running);
  }
  const t0 = performance.now();
  await enqueueAll();
  const enqueueSeconds = (performance.now() - t0) / 1000;
  const before = await durable();
  const started = performance.now();
  running = await start(false);
  let completed, workSeconds;
  try {
    [completed, workSeconds] = await finish(counter, a, started, async () => (await durable()) - before);
  } finally {
    await stop(running);
  }
  return { jobs: a.jobs, completed, enqueue_s: enqueueSeconds, work_s: workSeconds, latency_ms: latencies };
}

function report(fields) {
  console.log(JSON.stringify(fields));
}

function main(fn) {
  fn(parseArgs()).then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
}

module.exports = { Counter, SCENARIOS, main, report, runPhases, sleep };
