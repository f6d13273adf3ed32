// Peer runner of `pyscheduler bench peers`: pg-boss (npm, bench/peers/package.json).
//   node bench/peers/pg_boss.js DSN JOBS CONCURRENCY SAMPLES GAP_MS MAX_SECONDS
// pg-boss 10 is the last major version that runs on Node.js 20. Settings: CONCURRENCY
// work() pollers on the queue (v10 dropped teamSize: its docs say to call work() again
// for more concurrency), each fetching batchSize 1,000, pollingIntervalSeconds 0.5 (the
// minimum; pg-boss has no LISTEN/NOTIFY, so an idle worker finds a new job by polling);
// jobs inserted 10,000 per insert() call, then ANALYZE on its job table (else its
// completion UPDATE picks a slow plan and takes seconds).
const PgBoss = require("pg-boss");
const { Counter, main, report, runPhases, sleep } = require("./common");

const BATCH_SIZE = 1000;
const POLL_SECONDS = 0.5;
const QUEUE = "noop";

main(async (a) => {
  const counter = new Counter();
  const boss = new PgBoss({ connectionString: a.dsn, max: a.concurrency + 2 });
  boss.on("error", (e) => console.error(e));
  await boss.start();
  await boss.createQueue(QUEUE);
  const db = boss.getDb();
  const handler = async (jobs) => { for (const job of jobs) counter.handled(job.data); };
  const result = await runPhases(a, counter, {
    start: async () => {
      for (let i = 0; i < a.concurrency; i++) {
        await boss.work(QUEUE, { batchSize: BATCH_SIZE, pollingIntervalSeconds: POLL_SECONDS }, handler);
      }
    },
    stop: async () => {
      await boss.offWork(QUEUE); // the pollers stop after their current fetch: give them one interval
      await sleep(POLL_SECONDS * 1000 + 100);
    },
    enqueueOne: (payload) => boss.send(QUEUE, payload),
    enqueueAll: async () => {
      for (let done = 0; done < a.jobs; done += 10000) {
        const n = Math.min(10000, a.jobs - done);
        await boss.insert(Array.from({ length: n }, () => ({ name: QUEUE, data: {} })));
      }
      await db.executeSql("analyze pgboss.job");
    },
    durable: async () => Number((await db.executeSql(
      "select count(*) as n from pgboss.job where name = $1 and state = 'completed'", [QUEUE])).rows[0].n),
  });
  await boss.stop({ graceful: false, wait: true });
  report({ system: "pg-boss", version: require("pg-boss/package.json").version, ...result,
           settings: `${a.concurrency} work() pollers, batchSize ${BATCH_SIZE}, pollingIntervalSeconds ${POLL_SECONDS}, ANALYZE after enqueue` });
});
