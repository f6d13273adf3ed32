-- depends: 0004_roles
-- Future checks (seeds/are-we-there-yet.md): pending checks, their history,
-- the composite a SQL job receives, the defaults. Forward-only.

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
    created        timestamptz
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
    ended          timestamptz
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

-- The slot pass (next_check_at = slot) and the catch-up pass (< current slot)
-- scan exactly the unclaimed rows, in take order.
CREATE INDEX checks_due_idx ON pyscheduler.checks (next_check_at, id) WHERE claim IS NULL;
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
    CONSTRAINT check_history_outcome_check
        CHECK (outcome IN ('done', 'max_checks', 'horizon', 'past', 'timeout', 'error', 'deleted'))
);
CREATE INDEX check_history_ended_idx ON pyscheduler.check_history (ended);
CREATE INDEX check_history_entity_idx ON pyscheduler.check_history (entity_name, entity_key);

INSERT INTO pyscheduler.settings (name, value) VALUES
    ('checks_resolution', '15 minutes'),
    ('checks_max_checks', '5'),
    ('checks_horizon', '30 days'),
    ('checks_task_timeout', '1 hour')
ON CONFLICT (name) DO NOTHING;
