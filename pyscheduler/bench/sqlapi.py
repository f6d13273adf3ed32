"""The SQL only the benches use (pyscheduler/sqlapi.py): rows written behind the functions'
back to build a large database fast, probes of the tables, and the statements whose exact
text a bench measures (its hot paths, as it has always timed them). The public functions and
views they call otherwise come from the capabilities' sqlapi modules.
``tests/shared/test_sqlapi.py`` prepares each statement against the migrated catalog."""

from __future__ import annotations

from ..sqlapi import Query

# -- shared ----------------------------------------------------------------------------------------

# (name): whether the database has that function (a bench run with --no-migrate on an older one)
HAS_FUNCTION = Query("SELECT count(*) AS n FROM pg_proc WHERE pronamespace = 'pyscheduler'::regnamespace "
                     "AND proname = %s")
# the bench's own backend and database: a CPU meter tells its processes from the server's
BACKEND = Query("SELECT pg_backend_pid() AS pid, current_database() AS db")
# a no-op SQL job for checks: DDL (several statements), run as it is, not prepared
NOOP_CHECK_JOB = """
CREATE SCHEMA IF NOT EXISTS pyscheduler_bench;
CREATE OR REPLACE FUNCTION pyscheduler_bench.noop(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS 'SELECT NULL::timestamptz';
"""

# -- tasks -----------------------------------------------------------------------------------------

ANY_TASK = Query("SELECT EXISTS (SELECT 1 FROM pyscheduler.tasks) AS filled")
COMPLETED_IN_QUEUE = Query("SELECT count(*) AS n FROM pyscheduler.tasks WHERE queue = %s AND status = 'completed'")
DELETE_QUEUE = Query("DELETE FROM pyscheduler.tasks WHERE queue = %s")  # a bench's own rows, nothing else
DELETE_COMPLETED = Query("DELETE FROM pyscheduler.tasks WHERE queue = %s AND status = 'completed'")
# (queue, n) named: bench durable's sleeping tasks: n tasks of queue leased and put to sleep for a day
SLEEP_ALL = Query("SELECT count(pyscheduler.sleep_task(rn => l.rn, token => l.token, duration => '1 day')) "
                  "FROM pyscheduler.lease_tasks_lean(queue => %(queue)s, worker => 'bench-sleeper', n => %(n)s) l")
TASK_COUNT_ALL = Query("SELECT pyscheduler._task_count_all()")  # the tallies again, after rows written by hand
# (queue, n) named: n no-op tasks submitted in one call, their specs made by the server
SUBMIT_SERIES = Query("SELECT count(*) FROM pyscheduler.submit_tasks(queue => %(queue)s, specs => (SELECT jsonb_agg("
                      "jsonb_build_object('i', i)) FROM generate_series(1, %(n)s) i))")
# (queue, worker, b) named: the Worker's lease of b tasks, rn and token only
LEASE_LEAN = Query("SELECT rn, token FROM pyscheduler.lease_tasks_lean(queue => %(queue)s, worker => %(worker)s, "
                   "n => %(b)s)")
COMPLETE_LEASED = Query("SELECT count(*) FROM pyscheduler.complete_tasks(rns => %s, tokens => %s)")
COMPLETE_LEASED_BINARY = Query("SELECT count(*) FROM pyscheduler.complete_tasks(rns => %(rns)b, tokens => %(tokens)b)")
# tasks_cost, one call at a time: (queue, worker) lease, (rn, token) complete, (queue, spec) submit
LEASE_ONE = Query("SELECT pyscheduler.lease_task(queue => %s, worker => %s)")
COMPLETE_ONE = Query("SELECT pyscheduler.complete_task(rn => %s, token => %s)")
SUBMIT_ONE = Query("SELECT pyscheduler.submit_task(queue => %s, spec => %s::jsonb)")
SUBMIT_MANY = Query("SELECT count(*) FROM pyscheduler.submit_tasks(queue => %s, specs => %s::jsonb)")
# (queue, specs, run_in, unique_keys): the lean submit, delayed and keyed when those are not NULL
SUBMIT_LEAN = Query("SELECT count(*) FROM pyscheduler.submit_tasks_lean(queue => %s, specs => %s::jsonb, "
                    "run_in => %s::interval, unique_keys => %s::text[])")
# (queue, n): n tasks due in an hour
SUBMIT_LATER = Query("SELECT count(*) FROM pyscheduler.submit_tasks(queue => %s, specs => (SELECT jsonb_agg("
                     "jsonb_build_object('i', i)) FROM generate_series(1, %s) i), run_in => '1 hour')")

# tasks_flow: what flow control costs (submit with keys; leases over time; a join; workflows)
FLOW_SUBMIT = Query("SELECT count(*) FROM pyscheduler.submit_tasks(%s, %s, concurrency_keys => %s)")
FLOW_FIRST_LEASE = Query("SELECT min(leased_at) FROM pyscheduler.tasks WHERE queue = %s")
# (queue, first lease, first lease, seconds): the leases in the window
FLOW_LEASES = Query("SELECT count(*) FROM pyscheduler.tasks WHERE queue = %s AND leased_at >= %s "
                    "AND leased_at < %s::timestamptz + make_interval(secs => %s)")
# (first lease, queue, first lease, first lease, seconds): leases per 10 s of the window
FLOW_LEASES_PER_10S = Query(
    "SELECT floor(extract(epoch FROM leased_at - %s) / 10) AS w, count(*) FROM pyscheduler.tasks "
    "WHERE queue = %s AND leased_at >= %s AND leased_at < %s::timestamptz + make_interval(secs => %s) "
    "GROUP BY 1 ORDER BY 1")
# (children's rns, the join's rn): the last child's completion, the join's lease
FLOW_JOIN_TIMES = Query("SELECT (SELECT max(updated) FROM pyscheduler.tasks WHERE rn = ANY (%s)), "
                        "(SELECT leased_at FROM pyscheduler.tasks WHERE rn = %s)")
# (queue, specs) and (workflow): each with its answer, and reduced in the server (the backend's time)
FLOW_SUBMIT_TASKS = Query("SELECT pyscheduler.submit_tasks(%s, %s)")
FLOW_SUBMIT_TASKS_COUNT = Query("SELECT count(*) FROM pyscheduler.submit_tasks(%s, %s)")
FLOW_SUBMIT_WORKFLOW = Query("SELECT pyscheduler.submit_workflow(%s)")
FLOW_SUBMIT_WORKFLOW_SIZE = Query("SELECT pg_column_size(pyscheduler.submit_workflow(%s))")

# flatness: (lo, hi, n, quiet_every, running_every) named: tasks lo..hi of n submitted over the last
# 7 days, a deployment's mix of statuses (pyscheduler.bench.flatness.Tasks)
FLAT_TASKS = Query(
    "INSERT INTO pyscheduler.tasks (rn, seq, queue, spec, priority, status, progress, created, updated, "
    "errors, owner, deadline, history, attempts, run_at, submitted_by, waiting_on) "
    "SELECT pyscheduler._task_rn(pyscheduler._rn_prefix(c), i), i, "
    "CASE WHEN i %% %(quiet_every)s = 31 THEN 'quiet' ELSE 'q' || lpad((i %% 20)::text, 2, '0') END, "
    "jsonb_build_object('i', i), CASE WHEN i %% 7 = 0 THEN 90 ELSE 50 END, s::pyscheduler.task_status, "
    "CASE s WHEN 'completed' THEN 1 ELSE 0 END, c, "
    "CASE WHEN s IN ('completed', 'aborted', 'cancelled', 'running') THEN c + interval '1 second' ELSE c END, "
    "CASE s WHEN 'aborted' THEN '[{\"code\": \"boom\", \"args\": {}, \"description\": \"failed\"}]'::jsonb "
    "ELSE '[]'::jsonb END, CASE s WHEN 'running' THEN 'worker-' || (i %% 8) END, "
    "CASE s WHEN 'running' THEN now() + interval '1 hour' END, '[]'::jsonb, "
    "CASE WHEN s IN ('running', 'completed', 'aborted') THEN 1 ELSE 0 END, "
    "CASE s WHEN 'scheduled' THEN now() + (i %% 86400) * interval '1 second' END, current_user, "
    "CASE s WHEN 'waiting' THEN 1 ELSE 0 END "
    "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) i, "
    "LATERAL (SELECT now() - interval '7 days' + (i::float8 / %(n)s) * interval '7 days' AS c, "
    "CASE WHEN i %% 100 = 11 THEN 'ready' WHEN i %% 200 = 13 THEN 'scheduled' "
    "     WHEN i %% %(running_every)s = 17 THEN 'running' WHEN i %% 1000 = 19 THEN 'waiting' "
    "     WHEN i %% 100 = 23 THEN 'aborted' WHEN i %% 1000 = 29 THEN 'cancelled' "
    "     ELSE 'completed' END AS s) x")
FLAT_TASK_SEQ = Query("SELECT setval('pyscheduler.task_seq', greatest(%s, (SELECT last_value FROM "
                      "pyscheduler.task_seq)))")  # (the next seq at least)
TASK_RN_AGO = Query("SELECT pyscheduler._task_rn(pyscheduler._rn_prefix(now() - %s::interval), 0) AS rn")

# dashboard_pages: (n) tasks over the last day, 1 % ready, 1 % scheduled, 0.1 % running, 2 % aborted
PAGES_TASKS = Query("""
    INSERT INTO pyscheduler.tasks (rn, queue, spec, priority, status, progress, created, updated, errors,
                                   owner, deadline, history, attempts, run_at, submitted_by)
    SELECT pyscheduler._task_rn(pyscheduler._rn_prefix(now() - (i %% 86400) * interval '1 second'), i),
           'q' || (i %% 20), jsonb_build_object('i', i), 50,
           s::pyscheduler.task_status, CASE s WHEN 'running' THEN 0.5 ELSE 0 END,
           now() - (i %% 86400) * interval '1 second', now() - (i %% 86400) * interval '1 second',
           CASE s WHEN 'aborted' THEN '[{"code": "boom", "args": {}, "description": "failed"}]'::jsonb
                  ELSE '[]'::jsonb END,
           CASE s WHEN 'running' THEN 'worker-1' END,
           CASE s WHEN 'running' THEN now() + interval '1 hour' END, '[]'::jsonb,
           CASE WHEN s IN ('running', 'completed', 'aborted') THEN 1 ELSE 0 END,
           CASE s WHEN 'scheduled' THEN now() + interval '1 hour' END, 'pyscheduler_client'
      FROM (SELECT i, CASE WHEN i %% 100 = 0 THEN 'ready' WHEN i %% 100 = 1 THEN 'scheduled'
                           WHEN i %% 1000 = 2 THEN 'running' WHEN i %% 50 = 3 THEN 'aborted'
                           ELSE 'completed' END AS s
              FROM generate_series(1, %s) i) x""")

# failover: the tasks and the schedules' progress (the checks' and the delay relay's are counted
# in the bench's own tables)
FAILOVER_PROGRESS = Query(
    "SELECT (SELECT count(*) FROM pyscheduler.tasks WHERE queue = 'fo' AND status = 'completed') AS tasks, "
    "       (SELECT count(*) FROM pyscheduler.schedule_executions WHERE outcome = 'fired') AS schedules")
TASK_STATUSES = Query("SELECT status::text AS status, count(*) AS n FROM pyscheduler.tasks "
                      "WHERE rn = ANY(%s::uuid[]) GROUP BY 1")  # (rns)
TASKS_IN_QUEUE = Query("SELECT count(*) AS n FROM pyscheduler.tasks WHERE queue = %s")

# -- delay -----------------------------------------------------------------------------------------

# (1,000 ids, their value): 1,000 messages due now, as delay_cost and flatness time them
ENQUEUE_DUE_NOW = Query("SELECT count(*) FROM pyscheduler.enqueue_messages(ids => %s, deadlines => "
                        "array_fill(clock_timestamp(), ARRAY[1000]), vals => array_fill(%s::bytea, ARRAY[1000]), "
                        "store_late => true)")
CLAIM_READY = Query("SELECT id, deadline FROM pyscheduler.ready_and_claim(node => %s, max_count => 1000, "
                    "after => %s)")  # (node, after)
DELETE_FIRED = Query("SELECT count(*) FROM pyscheduler.delete_fired(ids => %s, node => %s)")
DELAY_COUNT_ALL = Query("SELECT pyscheduler._delay_count_all()")  # the tallies again, after rows written by hand
# flatness: (lo, hi) waiting messages 1 hour to 30 days ahead, 200-byte values; then (4 nodes, n / 1,000)
# 1,000 of them ready, claimed by nodes that never fire them
FLAT_DELAY_MESSAGES = Query(
    "INSERT INTO pyscheduler.delay_messages (id, deadline, value) "
    "SELECT 'cold-' || i, now() + interval '1 hour' + (i %% 2592000) * interval '1 second', "
    "convert_to(repeat('v', 200), 'UTF8') FROM generate_series(%s::bigint, %s::bigint) i")
FLAT_DELAY_READIED = Query(
    "UPDATE pyscheduler.delay_messages SET readied_at = now(), readied_by = (%s::uuid[])[1 + i %% 4] "
    "FROM generate_series(1, 1000) i WHERE id = 'cold-' || (i * %s)")

# -- schedules -------------------------------------------------------------------------------------

# the columns a bench schedule is cloned with from the first one (all but id, name and the
# generated ones; tests/schedules/test_sql.py checks it is every one): 1M create_schedule calls
# would take ~15 minutes, and the setup is not what is measured
CLONED_COLUMNS = (
    "every", "cron", "cron_spec", "tz", "start_at", "end_at", "max_runs", "target_kind", "target", "priority",
    "payload", "retry_attempts", "retry_base", "retry_jitter", "critical", "catchup_window", "overlap", "paused",
    "paused_note", "next_run_at", "trigger_at", "runs_count", "fired_count", "failed_count", "skipped_count",
    "missed_count", "consecutive_failures", "last_expected_at", "last_outcome", "last_error", "task_rns",
    "claim_token", "claimed_until", "created", "updated", "owner", "ended_note", "task_options")
# (name prefix, first i, last i, id of the schedule cloned) -> id of each clone, named prefix || i
CLONE_SCHEDULES = Query(
    f"INSERT INTO pyscheduler.schedules (name, {', '.join(CLONED_COLUMNS)}) "
    f"SELECT %s || i, {', '.join('s.' + c for c in CLONED_COLUMNS)} FROM pyscheduler.schedules s, "
    "generate_series(%s::int, %s::int) i WHERE s.id = %s RETURNING id")
# (first due ms, n, spread s, n, ids): schedule k of ids due at first + (k mod n) * spread / n
ARM_SCHEDULES = Query(
    "UPDATE pyscheduler.schedules s SET next_run_at = timestamptz 'epoch' + "
    "(%s + ((a.o - 1) %% %s) * 1000 * %s::numeric / %s)::bigint * interval '1 millisecond' "
    "FROM unnest(%s::bigint[]) WITH ORDINALITY a(id, o) WHERE s.id = a.id")
SCHEDULE_DUE = Query("SELECT id, next_run_at FROM pyscheduler.schedules WHERE id = ANY(%s)")
# (name LIKE pattern) twice: executions first (no foreign key), then the schedules
DROP_EXECUTIONS = Query("DELETE FROM pyscheduler.schedule_executions WHERE schedule_id IN "
                        "(SELECT id FROM pyscheduler.schedules WHERE name LIKE %s)")
DROP_SCHEDULES = Query("DELETE FROM pyscheduler.schedules WHERE name LIKE %s")
DELETE_SCHEDULE_ROW = Query("DELETE FROM pyscheduler.schedules WHERE id = %s")  # (id): a template, cloned
SCHEDULE_ID = Query("SELECT id FROM pyscheduler.schedules WHERE name = %s")
COUNT_SCHEDULES = Query("SELECT count(*) AS n FROM pyscheduler.schedules")

# schedules_due_views: (n, id of the template) n schedules named f-<i> due 15 to 60 s from now
_KEPT = [c for c in CLONED_COLUMNS if c != "next_run_at"]
DUE_VIEWS_CLONE = Query(
    f"INSERT INTO pyscheduler.schedules (name, next_run_at, {', '.join(_KEPT)}) "
    "SELECT 'f-' || i, now() + interval '15 seconds' + (i %% 45) * interval '1 second', "
    f"{', '.join('t.' + c for c in _KEPT)} FROM pyscheduler.schedules t, generate_series(1, %s) i WHERE t.id = %s")
SCHEDULES_LATE_BY_10S = Query("SELECT count(*) FROM pyscheduler.schedules WHERE due_at < now() - interval '10 seconds'")

# dashboard_pages: (first i, last i) schedules s-<i> every 1..60 minutes; then executions of a tenth
PAGES_SCHEDULES = Query("SELECT pyscheduler.create_schedule(name => 's-' || lpad(i::text, 7, '0'), every => "
                        "((i %% 60) + 1) * interval '1 minute', target => 'ticks', retry_attempts => 0) "
                        "FROM generate_series(%s::int, %s::int) i")
PAGES_EXECUTIONS = Query("""
    INSERT INTO pyscheduler.schedule_executions (schedule_id, expected_at, outcome, triggered, attempts,
                                                 fired_at, lateness)
    SELECT s.id, date_trunc('minute', now()) - k * interval '1 minute',
           CASE WHEN k %% 50 = 0 THEN 'failed' ELSE 'fired' END, false, 1,
           date_trunc('minute', now()) - k * interval '1 minute' + interval '20 milliseconds',
           interval '20 milliseconds'
      FROM pyscheduler.schedules s, generate_series(1, 10) k WHERE s.id %% 10 = 0""")

# failover: (name, since) one schedule's firings since the recovery; (name) all its firings
FAILOVER_FIRINGS = Query(
    "SELECT s.fired_count AS fired, count(e.*) AS rows, min(e.expected_at) AS first, "
    "max(e.expected_at) AS last, count(DISTINCT e.expected_at) AS slots "
    "FROM pyscheduler.schedules s LEFT JOIN pyscheduler.schedule_executions e "
    "ON e.schedule_id = s.id AND e.outcome = 'fired' AND e.expected_at >= %s "
    "WHERE s.name = %s GROUP BY s.fired_count")
FAILOVER_FIRED = Query("SELECT count(*) AS n FROM pyscheduler.schedule_executions e JOIN pyscheduler.schedules s "
                       "ON s.id = e.schedule_id WHERE s.name = %s AND e.outcome = 'fired'")


def _flat_clone(kind: str, target: str, critical: str, paused: str, note: str, next_run: str, fails: str,
                error: str, outcome: str, where: str = "WHERE t.id = %(first)s") -> Query:
    """(prefix, lo, hi, first) named: schedules prefix || lo..hi cloned from schedule ``first``,
    each field as given (SQL over t, the template, and i)."""
    cols = ("every", "cron", "cron_spec", "tz", "start_at", "end_at", "max_runs", "priority", "retry_attempts",
            "retry_base", "retry_jitter", "catchup_window", "overlap", "created", "updated", "owner")
    return Query(
        f"INSERT INTO pyscheduler.schedules (name, {', '.join(cols)}, target_kind, target, payload, critical, "
        "paused, paused_note, next_run_at, consecutive_failures, failed_count, last_error, last_outcome) "
        f"SELECT %(prefix)s || lpad(i::text, 8, '0'), {', '.join('t.' + c for c in cols)}, {kind}, {target}, "
        f"t.payload, {critical}, {paused}, {note}, {next_run}, {fails}, {fails}, {error}, {outcome} "
        f"FROM pyscheduler.schedules t, generate_series(%(lo)s::bigint, %(hi)s::bigint) i {where}")


# flatness: the stored schedules: 200 of each kind of row the views show in the first 1,200, then
# a share of the rest (pyscheduler.bench.flatness.Schedules)
FLAT_SCHEDULES_COLD = _flat_clone(
    kind="CASE k.cat WHEN 'http' THEN 'http' WHEN 'task' THEN 'task' ELSE 'kafka' END",
    target="CASE k.cat WHEN 'http' THEN 'https://example.com/hook' WHEN 'task' THEN 'flat-q' ELSE t.target END",
    critical="k.cat = 'plain' AND i %% 10 = 5", paused="k.cat = 'paused'",
    note="CASE WHEN k.cat = 'paused' THEN 'bench' END",
    next_run="CASE k.cat WHEN 'late' THEN now() - interval '1 hour' + (i %% 600) * interval '1 second' "
             "WHEN 'soon' THEN now() + (i %% 300) * interval '1 second' "
             "ELSE now() + interval '1 hour' + (i %% 2592000) * interval '1 second' END",
    fails="CASE WHEN k.cat = 'failing' THEN 1 + i %% 5 ELSE 0 END",
    error="CASE WHEN k.cat = 'failing' THEN 'bench: target down' END",
    outcome="CASE WHEN k.cat = 'failing' THEN 'failed' END",
    where=", LATERAL (SELECT CASE WHEN i <= 1200 THEN (ARRAY['paused', 'failing', 'late', 'soon', 'http', 'task'])"
          "[1 + (i - 1) / 200] WHEN i %% 100 = 1 THEN 'paused' WHEN i %% 200 = 9 THEN 'failing' "
          "WHEN i %% 1000 = 3 THEN 'late' WHEN i %% 1000 = 4 THEN 'soon' WHEN i %% 50 = 7 THEN 'http' "
          "WHEN i %% 50 = 8 THEN 'task' ELSE 'plain' END AS cat) k WHERE t.id = %(first)s")
# ... and (critical) the hot ones, due in a day
FLAT_SCHEDULES_HOT = _flat_clone(kind="'kafka'", target="t.target", critical="%(critical)s", paused="false",
                                 note="NULL", next_run="now() + interval '1 day'", fails="0", error="NULL",
                                 outcome="NULL")
# (schedule, n): its executions, one a second back from now, 1 % failed
FLAT_EXECUTIONS_PROBE = Query(
    "INSERT INTO pyscheduler.schedule_executions (schedule_id, expected_at, outcome, triggered, attempts, "
    "fired_at, lateness, error) SELECT %s, now() - i * interval '1 second', "
    "CASE WHEN i %% 100 = 0 THEN 'failed' ELSE 'fired' END, false, 1, now() - i * interval '1 second', "
    "interval '5 milliseconds', CASE WHEN i %% 100 = 0 THEN 'bench' END FROM generate_series(1, %s) i")
FLAT_FIRST_COLD = Query("SELECT min(id) AS m FROM pyscheduler.schedules WHERE name LIKE 'cold-%%'")
# (first id, n, lo, hi): executions lo..hi spread over the schedules first..first + n, a day ago
FLAT_EXECUTIONS = Query(
    "INSERT INTO pyscheduler.schedule_executions (schedule_id, expected_at, outcome, triggered, "
    "attempts, fired_at, lateness) SELECT %s + i %% %s, now() - interval '1 day' - i * interval "
    "'1 millisecond', 'fired', false, 1, now() - interval '1 day', interval '5 milliseconds' "
    "FROM generate_series(%s::bigint, %s::bigint) i")
# the hot schedules due now, their statistics left as they were (a day away)
FLAT_HOT_DUE_NOW = Query("UPDATE pyscheduler.schedules SET next_run_at = date_trunc('second', now()) - "
                         "interval '1 second', claim_token = NULL, claimed_until = NULL WHERE name LIKE 'hot-%%'")
FLAT_HOT_REDIS = Query("SELECT id, next_run_at FROM pyscheduler.schedules WHERE name LIKE 'hot-r-%%' ORDER BY id")
# the executors' PostgreSQL side, as flatness times it: (ids) then (ids, expected, outcomes, attempts[, tokens])
FIRE_DETAILS_COUNT = Query("SELECT count(*) FROM pyscheduler.fire_details(%s)")
RECORD_EXECUTIONS_COUNT = Query("SELECT count(*) FROM pyscheduler.record_executions(%s, %s, %s, %s)")
RECORD_CLAIMED_COUNT = Query("SELECT count(*) FROM pyscheduler.record_executions(%s, %s, %s, %s, NULL, %s)")
CLAIM_DUE_CRITICAL_1000 = Query("SELECT id, expected_at, claim_token FROM pyscheduler.claim_due_critical("
                                "max_schedules => 1000, hold => '30 seconds')")

# -- checks ----------------------------------------------------------------------------------------

# (entity, job, kind, first id, last id, slot, spread over the next slots?, resolution)
CHECKS_FILL = Query("""
INSERT INTO pyscheduler.checks (entity_name, entity_key, job, kind, first_check_at, next_check_at,
                                max_checks, horizon, created, owner)
SELECT %s, i::text, %s, %s, s, s, 5, '30 days', now(), current_user
  FROM generate_series(%s::bigint, %s::bigint) i,
       LATERAL (SELECT %s::timestamptz + CASE WHEN %s THEN (1 + mod(i, 2880)) * %s::interval
                                              ELSE interval '0' END AS s) x
""")
CHECKS_CLEAN = Query("DELETE FROM pyscheduler.checks WHERE entity_name = %s")
CHECKS_CLEAN_HISTORY = Query("DELETE FROM pyscheduler.check_history WHERE entity_name = %s")
CHECKS_DONE = Query("SELECT count(*) AS n FROM pyscheduler.check_history WHERE entity_name = %s AND outcome = 'done'")
CHECKS_DUE = Query("SELECT count(*) FROM pyscheduler.due_checks(slot => %s, max => %s)")  # under EXPLAIN ANALYZE
# dashboard_pages: (first i, last i) checks of 'order' over the next 30 days
PAGES_CHECKS = Query("SELECT pyscheduler.add_check(entity_name => 'order', entity_key => i::text, job => 'sms', "
                     "kind => 'python', check_after => (i %% 2592000) * interval '1 second') "
                     "FROM generate_series(%s::int, %s::int) i")
# flatness: (lo, hi) pending checks of 'order' over the 2,880 slots of the next 30 days, a few
# handed to a task job or in a missed slot; (lo, hi, n) as many ended ones over the last 30 days
FLAT_CHECKS = Query(
    "INSERT INTO pyscheduler.checks (entity_name, entity_key, job, kind, first_check_at, next_check_at, "
    "max_checks, horizon, created, owner, claim, claim_until) "
    "SELECT 'order', i::text, CASE i %% 20 WHEN 0 THEN 'flat-q' WHEN 1 THEN 'flat_handler' "
    "ELSE 'pyscheduler_bench.noop' END, CASE i %% 20 WHEN 0 THEN 'task' WHEN 1 THEN 'python' ELSE 'sql' END, "
    "s, s, 5, '30 days', now(), current_user, CASE WHEN handed THEN gen_random_uuid() END, "
    "CASE WHEN handed THEN now() + interval '1 hour' END "
    "FROM generate_series(%s::bigint, %s::bigint) i, pyscheduler._current_check_slot cur, "
    "LATERAL (SELECT i <= 200 OR i %% 10000 = 9 AS missed, i BETWEEN 201 AND 400 OR i %% 1000 = 7 "
    "                AS handed) k, "
    "LATERAL (SELECT cur.slot + CASE WHEN k.missed THEN -(1 + i %% 4) WHEN k.handed THEN 0 "
    "                                ELSE 1 + i %% 2880 END * interval '15 minutes' AS s) x")
FLAT_CHECK_HISTORY = Query(
    "INSERT INTO pyscheduler.check_history (id, entity_name, entity_key, job, kind, first_check_at, "
    "last_check_at, check_count, outcome, error, last_took, total_took, created, ended, owner) "
    "SELECT -i, 'order', i::text, CASE WHEN i %% 3 = 0 THEN 'flat_handler' ELSE 'pyscheduler_bench.noop' END, "
    "CASE WHEN i %% 3 = 0 THEN 'python' ELSE 'sql' END, e - interval '1 hour', e, 1 + i %% 5, "
    "(ARRAY['done', 'done', 'done', 'max_checks', 'error', 'deleted'])[1 + i %% 6], "
    "CASE WHEN i %% 6 = 4 THEN 'bench' END, (i %% 1000) * interval '1 millisecond', "
    "(i %% 5000) * interval '1 millisecond', e - interval '1 hour', e, current_user "
    "FROM generate_series(%s::bigint, %s::bigint) i, "
    "LATERAL (SELECT now() - (i::float8 / %s) * interval '30 days' AS e) x")
# (slots back): the start of the slot that many slots before the current one
FLAT_PAST_SLOT = Query("SELECT cur.slot - %s * interval '15 minutes' AS s FROM pyscheduler._current_check_slot cur")
# (entity key prefix, slot, slot, n): n no-op checks of entity 'hot' due in that slot
FLAT_HOT_CHECKS = Query(
    "INSERT INTO pyscheduler.checks (entity_name, entity_key, job, kind, first_check_at, next_check_at, "
    "max_checks, horizon, created, owner) SELECT 'hot', %s || '-' || i, 'pyscheduler_bench.noop', 'sql', "
    "%s, %s, 5, '30 days', now(), current_user FROM generate_series(1, %s) i")
# a runner's batches, as flatness times them: (slot, after) take, run, record; (slot) the take alone
RUN_DUE_CHECKS_1000 = Query("SELECT taken, last_id FROM pyscheduler.run_due_checks(slot => %s, max => 1000, "
                            "after => %s)")
DUE_CHECKS_1000 = Query("SELECT id FROM pyscheduler.due_checks(slot => %s, max => 1000)")


# -- flatness shapes (issue 34): stored work the planner's statistics mislead on ---------------------

def _flat_tasks_shape(queue: str, status: str, priority: str, created: str) -> Query:
    """(lo, hi, n) named: tasks i = lo..hi of n, each field as given (SQL over i and n; q is
    i / n), time-ordered ids as submit_task makes them; a running one leased for a day."""
    return Query(
        "INSERT INTO pyscheduler.tasks (rn, seq, queue, spec, priority, status, progress, created, updated, "
        "errors, owner, deadline, history, attempts, run_at, submitted_by) "
        "SELECT pyscheduler._task_rn(pyscheduler._rn_prefix(c), i), i, qu, jsonb_build_object('i', i), pr, "
        "s::pyscheduler.task_status, 0, c, c, '[]'::jsonb, CASE s WHEN 'running' THEN 'worker-1' END, "
        "CASE s WHEN 'running' THEN now() + interval '1 day' END, '[]'::jsonb, "
        "CASE WHEN s IN ('running', 'completed', 'aborted') THEN 1 ELSE 0 END, "
        "CASE s WHEN 'scheduled' THEN now() + (i %% 86400) * interval '1 second' END, current_user "
        "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) i, "
        "LATERAL (SELECT i::float8 / %(n)s AS q) f, "
        f"LATERAL (SELECT {queue} AS qu, {status} AS s, {priority} AS pr, {created} AS c) x")


_SPREAD = "now() - interval '7 days' + f.q * interval '7 days'"
_BUSY = "'q' || lpad((i %% 20)::text, 2, '0')"
_MIX = ("CASE WHEN i %% 100 = 11 THEN 'ready' WHEN i %% 200 = 13 THEN 'scheduled' WHEN i %% 100 = 23 THEN 'aborted' "
        "WHEN i %% 1000 = 29 THEN 'cancelled' ELSE 'completed' END")
# queue hot's completed tasks (60 %), quiet for two hours; then the busy queues' ready ones
FLAT_TASKS_QUIET = _flat_tasks_shape(
    queue=f"CASE WHEN f.q <= 0.6 THEN 'hot' ELSE {_BUSY} END",
    status="CASE WHEN f.q <= 0.6 THEN 'completed' ELSE 'ready' END",
    priority="CASE WHEN i %% 7 = 0 THEN 90 ELSE 50 END",
    created="CASE WHEN f.q <= 0.6 THEN now() - interval '7 days' + f.q / 0.6 * interval '166 hours' "
            "ELSE now() - interval '2 hours' + (f.q - 0.6) / 0.4 * interval '119 minutes' END")
# one queue (big) with 90 % of the tasks, in every status; the busy queues the rest
FLAT_TASKS_ONE_QUEUE = _flat_tasks_shape(
    queue=f"CASE WHEN i %% 10 = 0 THEN {_BUSY} ELSE 'big' END", status=_MIX,
    priority="CASE WHEN i %% 7 = 0 THEN 90 ELSE 50 END", created=_SPREAD)
# queue prio: a tenth of the tasks ready, 1,000 priorities with one task each, the others at 50
FLAT_TASKS_PRIORITIES = _flat_tasks_shape(
    queue=f"CASE WHEN i %% 10 = 0 THEN 'prio' ELSE {_BUSY} END",
    status="CASE WHEN i %% 10 = 0 THEN 'ready' ELSE 'completed' END",
    priority="CASE WHEN i %% 10 = 0 AND i <= 10000 THEN 1000 + i / 10 ELSE 50 END", created=_SPREAD)
# one task running (leased a week ago, for a day) among n - 1 finished
FLAT_TASKS_LONG_LEASE = _flat_tasks_shape(
    queue=f"CASE WHEN i = 1 THEN 'long' ELSE {_BUSY} END",
    status="CASE WHEN i = 1 THEN 'running' WHEN i %% 100 = 23 THEN 'aborted' ELSE 'completed' END",
    priority="50", created=_SPREAD)
# (lo, hi) messages all far off (2099 on), or all due in the last hour that no relay took
FLAT_DELAY_FAR = Query(
    "INSERT INTO pyscheduler.delay_messages (id, deadline, value) "
    "SELECT 'cold-' || i, timestamptz '2099-01-01' + (i %% 2592000) * interval '1 second', "
    "convert_to(repeat('v', 200), 'UTF8') FROM generate_series(%s::bigint, %s::bigint) i")
FLAT_DELAY_DUE = Query(
    "INSERT INTO pyscheduler.delay_messages (id, deadline, value) "
    "SELECT 'cold-' || i, now() - interval '1 hour' + (i %% 3600) * interval '1 second', "
    "convert_to(repeat('v', 200), 'UTF8') FROM generate_series(%s::bigint, %s::bigint) i")
# schedules all due at one instant (a daily cron of one zone: today's midnight UTC), none critical
FLAT_SCHEDULES_ONE_INSTANT = _flat_clone(
    kind="'kafka'", target="t.target", critical="false", paused="false", note="NULL",
    next_run="date_trunc('day', now())", fails="0", error="NULL", outcome="NULL")
# (lo, hi) checks all in the next slot
FLAT_CHECKS_ONE_SLOT = Query(
    "INSERT INTO pyscheduler.checks (entity_name, entity_key, job, kind, first_check_at, next_check_at, "
    "max_checks, horizon, created, owner) "
    "SELECT 'order', i::text, 'pyscheduler_bench.noop', 'sql', s, s, 5, '30 days', now(), current_user "
    "FROM generate_series(%s::bigint, %s::bigint) i, pyscheduler._current_check_slot cur, "
    "LATERAL (SELECT cur.slot + interval '15 minutes' AS s) x")

# activity_ranges: (n) tasks finished over the last 7 days, 20 queues, each waited 0-60 s to start
ACTIVITY_TASKS = Query("""
    INSERT INTO pyscheduler.tasks (rn, queue, spec, priority, status, progress, created, updated, errors,
                                   owner, history, attempts, leased_at, submitted_by)
    SELECT pyscheduler._task_rn(pyscheduler._rn_prefix(e - interval '1 minute'), i), 'q' || (i %% 20), '{}', 50,
           (ARRAY['completed', 'completed', 'aborted', 'cancelled'])[1 + i %% 4]::pyscheduler.task_status, 0,
           e - interval '1 minute', e, '[]', NULL, '[]', 1,
           e - interval '1 minute' + (i %% 61) * interval '1 second', 'pyscheduler_client'
      FROM generate_series(1, %(n)s) i,
           LATERAL (SELECT now() - %(span)s::interval + i * (%(span)s::interval / %(n)s) AS e) x""")
# activity_ranges: %(n)s schedule executions recorded evenly over the last %(span)s, a tenth failed
ACTIVITY_EXECUTIONS = Query("""
    INSERT INTO pyscheduler.schedule_executions (schedule_id, expected_at, outcome, triggered, attempts, fired_at,
                                                 lateness)
    SELECT i %% 100000, f - (i %% 7) * interval '1 second', CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'fired' END,
           false, 1, f, (i %% 7) * interval '1 second'
      FROM generate_series(1, %(n)s) i,
           LATERAL (SELECT now() - %(span)s::interval + i * (%(span)s::interval / %(n)s) AS f) x""")
# activity_ranges: forget every fold (the reads then read the tasks and executions, as before the rollups)
ACTIVITY_UNFOLD = Query("WITH a AS (DELETE FROM pyscheduler._task_minutes), "
                        "b AS (DELETE FROM pyscheduler._task_latency_minutes), "
                        "c AS (DELETE FROM pyscheduler._schedule_minutes), "
                        "d AS (DELETE FROM pyscheduler._schedule_latency_minutes), "
                        "e AS (UPDATE pyscheduler._schedule_minutes_folded SET upto = NULL) "
                        "UPDATE pyscheduler._task_minutes_folded SET upto = NULL")
ACTIVITY_FOLD = Query("SELECT pyscheduler._fold_task_minutes(), pyscheduler._fold_schedule_minutes()")
# activity_ranges: the dashboard's 7 d reads, as its overview and tasks page make them
ACTIVITY_WEEK = {
    "activity": Query("SELECT * FROM pyscheduler.activity(since => '7 days', bucket => '6 hours')"),
    "activity_latency": Query("SELECT * FROM pyscheduler.activity_latency(since => '7 days', bucket => '6 hours')"),
    "queue_activity": Query("SELECT * FROM pyscheduler.queue_activity(since => '7 days')"),
}
# activity_ranges: the overview's default 1 h reads (5 minute buckets)
ACTIVITY_HOUR = {
    "activity": Query("SELECT * FROM pyscheduler.activity(since => '1 hour', bucket => '5 minutes')"),
    "activity_latency": Query("SELECT * FROM pyscheduler.activity_latency(since => '1 hour', bucket => '5 minutes')"),
}

# -- upgrade_walk ------------------------------------------------------------------------------------

# What an upgraded database must hold as a fresh install does: a line per routine (with its grants),
# relation, column (with a collation other than its type's), index, constraint, trigger, type and
# storage option of schema pyscheduler (run with search_path pg_catalog, so every name is qualified
# the same way)
SCHEMA_FINGERPRINT = Query("""
SELECT 'routine ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
       || pg_get_function_result(p.oid) || ' ' || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text)
                                                                FROM unnest(p.proacl) x), '')
  FROM pg_proc p WHERE p.pronamespace = 'pyscheduler'::regnamespace
UNION ALL
SELECT 'relation ' || c.relkind::text || ' ' || c.relname || ' ' || coalesce(c.reloptions::text, '')
       || ' ' || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(c.relacl) x), '')
  FROM pg_class c WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relname NOT LIKE '\\_yoyo%'
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attcollation <> t.typcollation THEN ' collate ' || a.attcollation::regcollation::text ELSE '' END
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0
   AND NOT a.attisdropped AND c.relname NOT LIKE '\\_yoyo%'
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = 'pyscheduler'::regnamespace
   AND c.relname NOT LIKE '\\_yoyo%'
UNION ALL
SELECT 'constraint ' || n.conrelid::regclass::text || ' ' || n.conname || ' ' || pg_get_constraintdef(n.oid)
  FROM pg_constraint n WHERE n.connamespace = 'pyscheduler'::regnamespace
UNION ALL
SELECT 'trigger ' || t.tgrelid::regclass::text || ' ' || t.tgname
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = 'pyscheduler'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'type ' || t.typname FROM pg_type t WHERE t.typnamespace = 'pyscheduler'::regnamespace""")
