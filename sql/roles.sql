-- pyscheduler: roles. Loaded right after common.sql on every migrate.
--
-- One group role (NOLOGIN) per audience, its name in pyscheduler.settings as
-- '<audience>_role' (pyscheduler migrate --client-role/--worker-role/...):
--   client     applications: submit, view, cancel
--   worker     task workers: lease, heartbeat, finish their own leases
--   relay      the delay-queue relay: enqueue, claim, fire, recover
--   scheduler  the recurring-schedule daemons: index, claim, record executions
--   checker    the future-check runners: take due checks, record results
--   monitor    read-only dashboards and alerting: views, get and list functions
--   admin      everything, including the monitor and cleanup functions
-- docs/sql-api.md's roles table says who may call what (tests check it
-- against the catalog).
-- Grant one to a login role: GRANT pyscheduler_client TO app_user;
-- PUBLIC gets nothing on the schema. API functions are SECURITY DEFINER with a
-- pinned search_path, so the roles need no privileges on the tables.
-- Each capability's file grants its own functions with pyscheduler._grant().

CREATE OR REPLACE FUNCTION pyscheduler._role(p_audience text)
RETURNS name
LANGUAGE plpgsql STABLE  -- as a SQL function with a SET clause it was not inlined, but planned on every call
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    RETURN pyscheduler._setting(p_audience || '_role')::name;
END
$$;

-- _may_act_as(actor, owner): _may_act's rule for role actor instead of the caller (also an
-- event's emitter and the task it reaches, sql/tasks/7_durable.sql; a dropped role may nothing).
CREATE OR REPLACE FUNCTION pyscheduler._may_act_as(p_actor name, p_owner name)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
    SELECT coalesce(p_owner = p_actor, false)
        OR (EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_actor)
            AND ((p_owner IS NOT NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_owner)
                  AND pg_catalog.pg_has_role(p_actor, p_owner, 'MEMBER'))
                 OR pg_catalog.pg_has_role(p_actor, pyscheduler._role('admin'), 'MEMBER')));
$$;

-- _may_act(owner): whether the caller may change, trigger, delete or read the details
-- of work owned by owner (design.md: only the role that created it, a role it belongs
-- to, or the admin role). NULL owner (work from before ownership): admin only.
CREATE OR REPLACE FUNCTION pyscheduler._may_act(p_owner name)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
    SELECT pyscheduler._may_act_as(pyscheduler._caller(), p_owner);
$$;

-- _require_owner(owner, what): 42501 unless the caller may act on work owned by owner
-- (what names it in the message, e.g. 'schedule nightly').
CREATE OR REPLACE FUNCTION pyscheduler._require_owner(p_owner name, p_what text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF NOT pyscheduler._may_act(p_owner) THEN
        RAISE EXCEPTION '% belongs to another role', p_what
            USING ERRCODE = '42501',
                  HINT = 'Only the role that created it, a member of that role, or the admin role may act on it.';
    END IF;
END
$$;

-- _seen_owners(): the owners whose work's contents the caller sees (_may_act's rule: the
-- caller and the roles it is a member of; NULL: every owner, for admin). A read computes it
-- once (as an uncorrelated subquery, an InitPlan, in a view) and tests each row's owner
-- against it: coalesce(owner = ANY (seen), true) (owner = ANY (NULL) is NULL: admin sees all).
-- _may_act per row cost ~65 us a row through a view's SECURITY DEFINER wrapper (a view's
-- reader cannot read the settings it needs). Granted to the audiences whose views call it.
CREATE OR REPLACE FUNCTION pyscheduler._seen_owners()
RETURNS name[]
LANGUAGE plpgsql STABLE  -- keeps its plans: a SECURITY DEFINER SQL function is planned on every call
SECURITY DEFINER
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_caller name := pyscheduler._caller();
BEGIN
    IF pg_catalog.pg_has_role(v_caller, pyscheduler._role('admin'), 'MEMBER') THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY[v_caller] || ARRAY(SELECT r.rolname FROM pg_catalog.pg_roles r
                                     WHERE pg_catalog.pg_has_role(v_caller, r.oid, 'MEMBER'));
END
$$;

DO $roles$
DECLARE
    v_role name;
BEGIN
    FOR v_role IN SELECT value FROM pyscheduler.settings WHERE name LIKE '%\_role' ORDER BY name LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created concurrently by a migrate of another database
            END;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA pyscheduler TO %I', v_role);
    END LOOP;
END
$roles$;

REVOKE ALL ON SCHEMA pyscheduler FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA pyscheduler REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- _grant(audience, VARIADIC names): EXECUTE on the functions, SELECT on the
-- views of those names in schema pyscheduler, to the audience's role (and
-- always to the admin role). While migrate loads the function files (the
-- setting pyscheduler.grants is 'deferred'), it only notes the call in the
-- setting pyscheduler.deferred_grants (a JSON array of [audience, names]):
-- migrate makes the grants once every routine is defined and the signatures
-- sql/ no longer defines are dropped (a grant rewrites the catalog row of
-- every routine of the name, which would hide a stale one from that check).
CREATE OR REPLACE FUNCTION pyscheduler._grant(p_audience text, VARIADIC p_names text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_name text;
    v_role name;
    v_fn regprocedure;
    v_found boolean;
BEGIN
    IF current_setting('pyscheduler.grants', true) = 'deferred' THEN
        PERFORM set_config('pyscheduler.deferred_grants',
                           (coalesce(nullif(current_setting('pyscheduler.deferred_grants', true), ''), '[]')::jsonb
                            || jsonb_build_array(jsonb_build_array(p_audience, to_jsonb(p_names))))::text, false);
        RETURN;
    END IF;
    FOREACH v_role IN ARRAY ARRAY[pyscheduler._role(p_audience), pyscheduler._role('admin')] LOOP
        FOREACH v_name IN ARRAY p_names LOOP
            v_found := false;
            FOR v_fn IN
                SELECT p.oid::regprocedure FROM pg_proc p
                 WHERE p.pronamespace = 'pyscheduler'::regnamespace AND p.proname = v_name
            LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
                v_found := true;
            END LOOP;
            IF EXISTS (SELECT 1 FROM pg_class c
                        WHERE c.relnamespace = 'pyscheduler'::regnamespace AND c.relname = v_name
                          AND c.relkind IN ('v', 'm')) THEN
                EXECUTE format('GRANT SELECT ON pyscheduler.%I TO %I', v_name, v_role);
                v_found := true;
            END IF;
            IF NOT v_found THEN
                RAISE EXCEPTION 'nothing named % to grant', v_name USING ERRCODE = 'PS001';
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- _finish_grants(): run by the loader after every file: PUBLIC keeps no
-- EXECUTE on any function (CREATE OR REPLACE keeps old privileges, a new
-- function gets PUBLIC's by default).
CREATE OR REPLACE FUNCTION pyscheduler._finish_grants()
RETURNS void
LANGUAGE plpgsql
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pyscheduler FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA pyscheduler FROM PUBLIC;
END
$$;

SELECT pyscheduler._grant(audience, 'version')
  FROM unnest(ARRAY['client', 'worker', 'relay', 'scheduler', 'checker', 'monitor']) AS audience;
-- the views call it for their readers
SELECT pyscheduler._grant(audience, '_seen_owners') FROM unnest(ARRAY['client', 'monitor']) AS audience;
-- the input rule's checks (common.sql) run as the caller while its arguments are coerced to the
-- domains of the public functions' parameters
SELECT pyscheduler._grant(audience, '_label_ok', '_label_refusal', '_refuse_label', '_refuse_text', '_payload_ok',
                          '_refuse_payload')
  FROM unnest(ARRAY['client', 'worker', 'relay', 'scheduler', 'checker', 'monitor']) AS audience;
