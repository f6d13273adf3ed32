-- Fresh install: the recurring schedules' tables (seeds/schedulinator.md), in one place.
-- Must equal what migrations/0007_schedules.sql, 0009_schedules_perf.sql and
-- 0014_schedules_hardening.sql, 0015_schedules_daemons.sql, 0018_flat_reads.sql,
-- 0021_flat_reads_tasks.sql, 0023_schedules_due_index.sql,
-- 0035_schedule_task_options.sql, 0036_flat_read_plans.sql and 0039_dashboard.sql build
-- (tests/ops/test_migrate.py checks).
INSERT INTO pyscheduler.settings (name, value) VALUES
    ('schedules_execution_retention', '30 days'),
    ('schedules_max_payload_bytes', '65536')
ON CONFLICT (name) DO NOTHING;

-- One row per schedule; name is unique overall. Exactly one of every/cron.
-- next_run_at is the next regular occurrence (NULL: ended); trigger_at a
-- pending out-of-band fire (trigger_schedule); due_at what the indexes hold;
-- critical_due_at the same for critical schedules only (NULL otherwise): what
-- the Postgres-only claim scans. Every firing updates the row (fillfactor
-- leaves room for its new version on the same page).
-- The counts survive the purge of old executions. owner: the role that created
-- it (only it, its members and admin act on it); task_options: the options of
-- the tasks a task target submits (NULL: none); ended_note: why next_run_at
-- is NULL (end_at, max_runs, no occurrence before 9999-01-01).
CREATE TABLE pyscheduler.schedules (
    id                   bigint GENERATED ALWAYS AS IDENTITY,
    name                 text NOT NULL,
    every                interval,
    cron                 text,
    cron_spec            bigint[],
    tz                   text NOT NULL,
    start_at             timestamptz,
    end_at               timestamptz,
    max_runs             bigint,
    target_kind          text NOT NULL,
    target               text NOT NULL,
    priority             bigint NOT NULL,
    payload              jsonb NOT NULL,
    retry_attempts       integer NOT NULL,
    retry_base           interval NOT NULL,
    retry_jitter         interval NOT NULL,
    critical             boolean NOT NULL,
    catchup_window       interval NOT NULL,
    overlap              text NOT NULL,
    paused               boolean NOT NULL,
    paused_note          text,
    next_run_at          timestamptz,
    trigger_at           timestamptz,
    due_at               timestamptz GENERATED ALWAYS AS (
                             CASE WHEN paused THEN trigger_at ELSE least(next_run_at, trigger_at) END) STORED,
    runs_count           bigint NOT NULL DEFAULT 0,
    fired_count          bigint NOT NULL DEFAULT 0,
    failed_count         bigint NOT NULL DEFAULT 0,
    skipped_count        bigint NOT NULL DEFAULT 0,
    missed_count         bigint NOT NULL DEFAULT 0,
    consecutive_failures integer NOT NULL DEFAULT 0,
    last_expected_at     timestamptz,
    last_outcome         text,
    last_error           text,
    task_rns             uuid[] NOT NULL DEFAULT '{}',
    claim_token          uuid,
    claimed_until        timestamptz,
    created              timestamptz NOT NULL,
    updated              timestamptz NOT NULL,
    critical_due_at      timestamptz GENERATED ALWAYS AS (
                             CASE WHEN critical THEN CASE WHEN paused THEN trigger_at
                                                          ELSE least(next_run_at, trigger_at) END END) STORED,
    owner                name NOT NULL,
    ended_note           text,
    task_options         jsonb,
    CONSTRAINT schedules_pkey PRIMARY KEY (id),
    CONSTRAINT schedules_name_key UNIQUE (name),
    CONSTRAINT schedules_recurrence_check CHECK ((every IS NULL) <> (cron IS NULL)),
    CONSTRAINT schedules_cron_spec_check CHECK ((cron IS NULL) = (cron_spec IS NULL)),
    CONSTRAINT schedules_target_kind_check CHECK (target_kind IN ('kafka', 'http', 'task')),
    CONSTRAINT schedules_overlap_check CHECK (overlap IN ('allow', 'skip', 'buffer_one'))
)
-- Every firing updates its row: vacuum by counts, as for tasks.
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
      autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05, fillfactor = 80);

-- The degraded-mode claim (claim_due_critical) scans this one.
CREATE INDEX schedules_critical_due_idx ON pyscheduler.schedules (critical_due_at) WHERE critical_due_at IS NOT NULL;
-- Resync hands out critical schedules first (this index), then the others (the primary key),
-- by id; a non-critical firing writes no entry here (0023_schedules_due_index).
CREATE INDEX schedules_critical_id_idx ON pyscheduler.schedules (id) WHERE critical;
-- list_schedules(paused => true) and schedules_paused page by name through the paused ones
-- only (0018_flat_reads).
CREATE INDEX schedules_paused_name_idx ON pyscheduler.schedules (name) WHERE paused;
-- list_schedules(critical => true): through the critical ones only, by name (0036_flat_read_plans).
CREATE INDEX schedules_critical_name_idx ON pyscheduler.schedules (name) WHERE critical;
-- schedules_due_soon, schedules_late and schedules_late_count read the rows they return
-- and no other (0023_schedules_due_index). Every firing changes due_at, so a firing is not a
-- HOT update: a binned due time kept it HOT but left every schedule firing more often than
-- hourly in one bin, which the views then read whole.
CREATE INDEX schedules_due_idx ON pyscheduler.schedules (due_at) WHERE due_at IS NOT NULL;
-- list_schedules(name_like => 'prefix%'): the names with that prefix, in any collation
-- (text_pattern_ops; 0021_flat_reads_tasks).
CREATE INDEX schedules_name_pattern_idx ON pyscheduler.schedules (name text_pattern_ops);
-- schedules_failing, in its order; a healthy firing adds no entry (consecutive_failures 0), nor
-- a paused schedule (0039_dashboard).
CREATE INDEX schedules_failing_idx ON pyscheduler.schedules (consecutive_failures DESC, name)
    WHERE consecutive_failures > 0 AND NOT paused;
-- find_schedules(prefix): the targets with that prefix (0039_dashboard).
CREATE INDEX schedules_target_pattern_idx ON pyscheduler.schedules (target text_pattern_ops, name);

-- One row per (schedule, expected time): a fire recorded twice counts once.
-- No foreign key (a per-row check on the hottest INSERT): delete_schedule
-- deletes a schedule's executions itself.
-- 'missed' rows summarise missed_count occurrences from expected_at on.
CREATE TABLE pyscheduler.schedule_executions (
    schedule_id  bigint NOT NULL,
    expected_at  timestamptz NOT NULL,
    outcome      text NOT NULL,
    triggered    boolean NOT NULL,
    attempts     integer NOT NULL,
    fired_at     timestamptz NOT NULL,
    lateness     interval,
    missed_count bigint,
    error        text,
    task_rn      uuid,
    CONSTRAINT schedule_executions_pkey PRIMARY KEY (schedule_id, expected_at),
    CONSTRAINT schedule_executions_outcome_check
        CHECK (outcome IN ('fired', 'failed', 'skipped_overlap', 'missed'))
);
-- The retention purge scans by record time; rows arrive in fired_at order, so
-- a BRIN index serves it at almost no cost per INSERT.
CREATE INDEX schedule_executions_fired_at_idx ON pyscheduler.schedule_executions USING brin (fired_at);
-- schedule_runs(with_outcome => failed | skipped_overlap | missed): a schedule's
-- executions other than 'fired', newest first (a firing adds no entry here).
CREATE INDEX schedule_executions_unfired_idx ON pyscheduler.schedule_executions (schedule_id, expected_at)
    WHERE outcome <> 'fired';

-- Resync state (the seed's optimistic scheme, one version key per sync id):
-- takers hand out key ranges in (critical first, id) order under this row's lock.
CREATE TABLE pyscheduler._schedule_resyncs (
    sync_id       text NOT NULL,
    done_critical boolean NOT NULL,
    after_id      bigint NOT NULL,
    done          bigint NOT NULL,
    total         bigint NOT NULL,
    started       timestamptz NOT NULL,
    CONSTRAINT _schedule_resyncs_pkey PRIMARY KEY (sync_id)
);

-- Resync leases (migration 0015_schedules_daemons): each range handed out is
-- leased to its taker until it acknowledges it (its next resync_take, made after
-- the write to Redis) or the lease expires and another taker takes it again.
ALTER TABLE pyscheduler._schedule_resyncs ADD COLUMN exhausted boolean NOT NULL DEFAULT false;
CREATE TABLE pyscheduler._schedule_resync_leases (
    sync_id  text NOT NULL,
    critical boolean NOT NULL,
    after_id bigint NOT NULL,
    last_id  bigint NOT NULL,
    n        bigint NOT NULL,
    owner    text NOT NULL,
    until    timestamptz NOT NULL,
    CONSTRAINT _schedule_resync_leases_pkey PRIMARY KEY (sync_id, critical, after_id)
);

-- migrations/0043_schedule_minutes.sql: per minute, the schedule executions recorded per
-- outcome (with the largest lateness) and a histogram of their lateness, folded by
-- _fold_schedule_minutes (called by purge_executions) up to _schedule_minutes_folded.upto;
-- minutes older than 8 days are deleted by the fold. activity() and activity_latency() read
-- them for any whole-minute bucket and the executions only since.
CREATE TABLE pyscheduler._schedule_minutes (
    minute  timestamptz NOT NULL,
    outcome text        NOT NULL,
    n       bigint      NOT NULL,
    worst   interval,
    PRIMARY KEY (minute, outcome)
);
CREATE TABLE pyscheduler._schedule_latency_minutes (
    minute timestamptz NOT NULL,
    k      smallint    NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, k)
);
CREATE TABLE pyscheduler._schedule_minutes_folded (
    one  boolean     PRIMARY KEY DEFAULT true CHECK (one),
    upto timestamptz
);
INSERT INTO pyscheduler._schedule_minutes_folded (upto) VALUES (NULL);
