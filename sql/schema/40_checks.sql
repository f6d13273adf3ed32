-- Future checks (seeds/are-we-there-yet.md): pending checks, their history,
-- the composite a SQL job receives, the defaults. Fresh install: must equal
-- migrations/0008_checks.sql + 0013_checks_hardening.sql + 0018_flat_reads.sql
-- (tests/ops/test_migrate.py compares the two).

-- A pending check: what a SQL job function receives (job(c pyscheduler.future_check)
-- RETURNS timestamptz) and what due_checks and list_checks return.
CREATE TYPE pyscheduler.future_check AS (
    id             bigint,
    entity_name    text,
    entity_key     text,
    job            text,
    kind           text,
    payload        jsonb,
    first_check_at timestamptz,
    next_check_at  timestamptz,
    check_count    integer,
    max_checks     integer,
    created        timestamptz,
    owner          text
);

-- A check that left: what check_history() returns.
CREATE TYPE pyscheduler.ended_check AS (
    id             bigint,
    entity_name    text,
    entity_key     text,
    job            text,
    kind           text,
    payload        jsonb,
    first_check_at timestamptz,
    last_check_at  timestamptz,
    check_count    integer,
    outcome        text,
    error          text,
    last_took      interval,
    total_took     interval,
    created        timestamptz,
    ended          timestamptz,
    owner          text
);

-- One row per pending check: the seed's future_job. A row leaves (into
-- check_history) when its job says "no more checks", when a guard ends it, or
-- when it is deleted. Slots are UTC-aligned multiples of the resolution.
CREATE TABLE pyscheduler.checks (
    id             bigint GENERATED ALWAYS AS IDENTITY,
    entity_name    text NOT NULL,
    entity_key     text NOT NULL,
    job            text NOT NULL,
    kind           text NOT NULL,
    payload        jsonb,
    first_check_at timestamptz NOT NULL,
    next_check_at  timestamptz NOT NULL,
    last_check_at  timestamptz,
    check_count    integer NOT NULL DEFAULT 0,
    max_checks     integer NOT NULL,
    horizon        interval NOT NULL,
    last_took      interval,
    total_took     interval NOT NULL DEFAULT '0',
    claim          uuid,
    claim_until    timestamptz,
    task_rn        uuid,
    created        timestamptz NOT NULL,
    owner          text NOT NULL,  -- the role that added it (convention C; text, not the 64-byte name: a
                                   -- hot table); its job runs only if that role may EXECUTE it
    CONSTRAINT checks_pkey PRIMARY KEY (id),
    CONSTRAINT checks_entity_job_key UNIQUE (entity_name, entity_key, job),
    CONSTRAINT checks_kind_check CHECK (kind IN ('sql', 'python', 'task')),
    CONSTRAINT checks_claim_check CHECK ((claim IS NULL) = (claim_until IS NULL))
)
-- Autovacuum by counts: every finished check leaves a dead entry at the front
-- of its slot in checks_due_idx that later takes step over until VACUUM; a
-- large table would otherwise wait for a fifth of itself in dead rows.
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
      autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.05);

-- Every pending check in take order (0018_flat_reads): the slot pass (next_check_at =
-- slot) and the catch-up pass (< current slot) skip the ones handed to a task job (no more
-- than tasks in flight: such a check keeps its slot while the task runs); list_checks and
-- overdue_checks walk it in their order.
CREATE INDEX checks_due_idx ON pyscheduler.checks (next_check_at, id);
-- Checks handed to a task job whose task never reported back.
CREATE INDEX checks_claimed_idx ON pyscheduler.checks (claim_until) WHERE claim IS NOT NULL;

-- Every check that left pyscheduler.checks, with how and why.
CREATE TABLE pyscheduler.check_history (
    id             bigint NOT NULL,
    entity_name    text NOT NULL,
    entity_key     text NOT NULL,
    job            text NOT NULL,
    kind           text NOT NULL,
    payload        jsonb,
    first_check_at timestamptz NOT NULL,
    last_check_at  timestamptz,
    check_count    integer NOT NULL,
    outcome        text NOT NULL,
    error          text,
    last_took      interval,
    total_took     interval NOT NULL,
    created        timestamptz NOT NULL,
    ended          timestamptz NOT NULL,
    owner          text NOT NULL,
    CONSTRAINT check_history_outcome_check
        CHECK (outcome IN ('done', 'max_checks', 'horizon', 'past', 'timeout', 'error', 'deleted'))
);
-- check_history pages newest first by (ended, id); the purge reads it oldest first
CREATE INDEX check_history_ended_idx ON pyscheduler.check_history (ended, id);
CREATE INDEX check_history_entity_idx ON pyscheduler.check_history (entity_name, entity_key);

-- What a client asked of a check a runner holds (taken by a pass, or handed to a task job):
-- delete_checks and add_check never wait for a runner's batch. delete_by: end it as
-- 'deleted' (not run if it has not started); readd_*: add it again once the run in progress
-- ends it (dropped if the run reschedules it: the check is pending). Applied by the runner
-- that ends or reschedules the check, or by the catch-up pass.
CREATE TABLE pyscheduler.check_requests (
    check_id         bigint NOT NULL,
    entity_name      text NOT NULL,
    entity_key       text NOT NULL,
    job              text NOT NULL,
    delete_by        text,
    readd_kind       text,
    readd_payload    jsonb,
    readd_at         timestamptz,
    readd_max_checks integer,
    readd_horizon    interval,
    readd_by         text,
    requested        timestamptz NOT NULL,
    CONSTRAINT check_requests_pkey PRIMARY KEY (check_id)
);

-- checks_per_slot's counts: pending checks no task job holds (claim IS NULL), per slot and
-- kind, as deltas appended by triggers on pyscheduler.checks and folded now and then
-- (sql/checks.sql keeps them).
CREATE TABLE pyscheduler._check_slot_counts (
    slot timestamptz NOT NULL,
    kind text NOT NULL,
    n    bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
CREATE INDEX _check_slot_counts_slot_idx ON pyscheduler._check_slot_counts (slot);

-- check_outcomes' figures per hour (of ended), job and outcome, as deltas appended by
-- triggers on pyscheduler.check_history and folded now and then.
CREATE TABLE pyscheduler._check_outcome_counts (
    hour     timestamptz NOT NULL,
    job      text NOT NULL,
    outcome  text NOT NULL,
    n        bigint NOT NULL,
    n_took   bigint NOT NULL,
    sum_took interval,
    max_took interval,
    sum_runs bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

INSERT INTO pyscheduler.settings (name, value) VALUES
    ('checks_resolution', '15 minutes'),
    ('checks_max_checks', '5'),
    ('checks_horizon', '30 days'),
    ('checks_task_timeout', '1 hour'),
    ('checks_history_retention', '30 days'),
    ('checks_max_payload_bytes', '65536')
ON CONFLICT (name) DO NOTHING;
