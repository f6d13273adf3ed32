-- Fresh install: the domains of the input rule (issue 27 B) and the functions their checks call
-- (same DDL as migrations/0031_input_domains.sql and, at its end, 0038_durable.sql; tests/ops/test_migrate.py checks). The functions
-- are reloaded from sql/common.sql on every migrate; docs/sql-api.md, "Input", lists the domains.

-- _label_ok(text, max_bytes): _label_refusal(text, max_bytes) IS NULL, as one expression
-- (SQL-standard body: parsed here, so the caller's search_path cannot change what it calls).
CREATE OR REPLACE FUNCTION pyscheduler._label_ok(p_text text, p_max_bytes integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.octet_length(p_text) BETWEEN 1 AND p_max_bytes
   AND p_text !~ ('^[\s\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]|[\s\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]$'
                  '|[\u0001-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufeff\ufff9-\ufffb]');

-- _refuse_label(text, field, max_bytes, code, max_chars): raise code naming field with why
-- text is not a label of at most max_bytes bytes (and max_chars characters); false when it
-- is one (the domain's check then fails as a plain check_violation).
CREATE OR REPLACE FUNCTION pyscheduler._refuse_label(p_text text, p_field text, p_max_bytes integer, p_code text,
                                                     p_max_chars integer DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
DECLARE
    v_why text := coalesce(pyscheduler._label_refusal(p_text, p_max_bytes),
                           CASE WHEN char_length(p_text) > p_max_chars
                                THEN format('must be at most %s characters', p_max_chars) END);
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION '% %, got %', p_field, v_why, quote_literal(left(p_text, 100))
            USING ERRCODE = p_code,
                  HINT = 'Names and labels are one line of printable characters without leading or trailing white space.';
    END IF;
    RETURN false;
END
$$;

-- _refuse_text(text, field, max_bytes, code): raise code naming field when free text (one
-- that may hold any character PostgreSQL stores, newlines included) is longer than max_bytes.
CREATE OR REPLACE FUNCTION pyscheduler._refuse_text(p_text text, p_field text, p_max_bytes integer, p_code text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF octet_length(p_text) > p_max_bytes THEN
        RAISE EXCEPTION '% is % bytes, more than %', p_field, octet_length(p_text), p_max_bytes
            USING ERRCODE = p_code;
    END IF;
    RETURN false;
END
$$;

-- _payload_ok(value, levels, max_bytes): whether a JSON payload nests at most `levels`
-- levels (the top value is level 1: {"a": [1]} nests 3) and is at most max_bytes stored.
-- strict $.**{n} finds a value only when the payload nests more than n levels, through n
-- containers of at least 8 bytes each (a header, and its entry in its parent): so an
-- uncompressed payload of less than 8 * levels bytes is accepted without a walk (the usual
-- small spec or result: two reads of its header). A larger one is walked once, ~8 us a KB.
CREATE OR REPLACE FUNCTION pyscheduler._payload_ok(p_value jsonb, p_levels integer, p_max_bytes integer)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
RETURN (pg_catalog.pg_column_size(p_value) < 8 * p_levels AND pg_catalog.pg_column_compression(p_value) IS NULL)
    OR (pg_catalog.pg_column_size(p_value) <= p_max_bytes
        AND NOT pg_catalog.jsonb_path_exists(p_value, ('strict $.**{' || p_levels::text || '}')::jsonpath));

-- _refuse_payload(value, field, levels, max_bytes, code): raise code naming field when the
-- payload is larger than max_bytes or nests more than `levels` levels; false otherwise.
CREATE OR REPLACE FUNCTION pyscheduler._refuse_payload(p_value jsonb, p_field text, p_levels integer,
                                                       p_max_bytes integer, p_code text)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pyscheduler, pg_temp
AS $$
BEGIN
    IF pg_column_size(p_value) > p_max_bytes THEN
        RAISE EXCEPTION '% is % bytes, more than %', p_field, pg_column_size(p_value), p_max_bytes
            USING ERRCODE = p_code, HINT = 'Keep large data elsewhere and pass a reference.';
    END IF;
    IF jsonb_path_exists(p_value, ('strict $.**{' || p_levels::text || '}')::jsonpath) THEN
        RAISE EXCEPTION '% nests more than % levels', p_field, p_levels
            USING ERRCODE = p_code,
                  HINT = format('At most %s levels (the top value is level 1), which every reader of pyscheduler '
                                '(Python''s json and orjson, the dashboard) loads.', p_levels);
    END IF;
    RETURN false;
END
$$;

-- Names and labels: _label_refusal's rule (sql/common.sql): 1..N bytes, no leading or trailing
-- white space, no control, zero-width, bidirectional formatting or separator character.
-- Each raises the SQLSTATE its capability documents for that argument.
CREATE DOMAIN pyscheduler.queue_name AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 40) OR pyscheduler._refuse_label(VALUE, 'queue', 40, 'PS208'));
CREATE DOMAIN pyscheduler.worker_id AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 40) OR pyscheduler._refuse_label(VALUE, 'worker', 40, 'PS208'));
CREATE DOMAIN pyscheduler.role_name AS name
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE::text, 63) OR pyscheduler._refuse_label(VALUE::text, 'owner', 63, 'PS208'));
CREATE DOMAIN pyscheduler.queue_note AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 1000) OR pyscheduler._refuse_label(VALUE, 'note', 1000, 'PS208'));
CREATE DOMAIN pyscheduler.status_word AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 40) OR pyscheduler._refuse_label(VALUE, 'status', 40, 'PS208'));
CREATE DOMAIN pyscheduler.unique_key AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200)
           OR pyscheduler._refuse_label(VALUE, 'unique_key', 200, 'PS213'));
CREATE DOMAIN pyscheduler.concurrency_key AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200)
           OR pyscheduler._refuse_label(VALUE, 'concurrency_key', 200, 'PS215'));
CREATE DOMAIN pyscheduler.parent_failure AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 40)
           OR pyscheduler._refuse_label(VALUE, 'on_parent_failure', 40, 'PS219'));
CREATE DOMAIN pyscheduler.schedule_name AS text
    CHECK (VALUE IS NULL OR (pyscheduler._label_ok(VALUE, 800) AND pg_catalog.char_length(VALUE) <= 200)
           OR pyscheduler._refuse_label(VALUE, 'name', 800, 'PS310', 200));
CREATE DOMAIN pyscheduler.name_pattern AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 1600)
           OR pyscheduler._refuse_label(VALUE, 'name_like', 1600, 'PS312'));
CREATE DOMAIN pyscheduler.schedule_note AS text
    CHECK (VALUE IS NULL OR (pyscheduler._label_ok(VALUE, 1000) AND pg_catalog.char_length(VALUE) <= 1000)
           OR pyscheduler._refuse_label(VALUE, 'note', 1000, 'PS312', 1000));
CREATE DOMAIN pyscheduler.schedule_overlap AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 40) OR pyscheduler._refuse_label(VALUE, 'overlap', 40, 'PS312'));
CREATE DOMAIN pyscheduler.schedule_outcome AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 40) OR pyscheduler._refuse_label(VALUE, 'outcome', 40, 'PS312'));
CREATE DOMAIN pyscheduler.target_kind AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 40)
           OR pyscheduler._refuse_label(VALUE, 'target_kind', 40, 'PS307'));
CREATE DOMAIN pyscheduler.time_zone AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 100) OR pyscheduler._refuse_label(VALUE, 'tz', 100, 'PS303'));
CREATE DOMAIN pyscheduler.sync_id AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200)
           OR pyscheduler._refuse_label(VALUE, 'sync_id', 200, 'PS312'));
CREATE DOMAIN pyscheduler.resync_owner AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200) OR pyscheduler._refuse_label(VALUE, 'owner', 200, 'PS312'));
CREATE DOMAIN pyscheduler.entity_name AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 100)
           OR pyscheduler._refuse_label(VALUE, 'entity_name', 100, 'PS401'));
CREATE DOMAIN pyscheduler.entity_key AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 1000)
           OR pyscheduler._refuse_label(VALUE, 'entity_key', 1000, 'PS401'));
CREATE DOMAIN pyscheduler.job_name AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200) OR pyscheduler._refuse_label(VALUE, 'job', 200, 'PS402'));
CREATE DOMAIN pyscheduler.check_kind AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 40) OR pyscheduler._refuse_label(VALUE, 'kind', 40, 'PS402'));
-- a delay message id a client gives (the chronosMessageId header): 1..128 characters
CREATE DOMAIN pyscheduler.message_id AS text
    CHECK (VALUE IS NULL OR (pyscheduler._label_ok(VALUE, 512) AND pg_catalog.char_length(VALUE) <= 128)
           OR pyscheduler._refuse_label(VALUE, 'id', 512, 'PS101', 128));

-- Names as lookups (the functions that find existing work by name): a size cap only, so work
-- named before the rule can still be read, paused and deleted through the API; what is
-- created is judged by the name domains above.
CREATE DOMAIN pyscheduler.schedule_ref AS text
    CHECK (VALUE IS NULL OR pg_catalog.octet_length(VALUE) <= 800 OR pyscheduler._refuse_text(VALUE, 'name', 800, 'PS310'));
CREATE DOMAIN pyscheduler.entity_ref AS text
    CHECK (VALUE IS NULL OR pg_catalog.octet_length(VALUE) <= 1000
           OR pyscheduler._refuse_text(VALUE, 'entity name or key', 1000, 'PS401'));

-- Free text: any character PostgreSQL stores (a cron expression, a target the capability
-- checks itself, an error a daemon records: these may hold newlines), at most N bytes.
CREATE DOMAIN pyscheduler.cron_expr AS text
    CHECK (VALUE IS NULL OR pg_catalog.octet_length(VALUE) <= 1000
           OR pyscheduler._refuse_text(VALUE, 'cron', 1000, 'PS301'));
CREATE DOMAIN pyscheduler.schedule_target AS text
    CHECK (VALUE IS NULL OR pg_catalog.octet_length(VALUE) <= 2048
           OR pyscheduler._refuse_text(VALUE, 'target', 2048, 'PS307'));
CREATE DOMAIN pyscheduler.execution_error AS text
    CHECK (VALUE IS NULL OR pg_catalog.octet_length(VALUE) <= 1048576
           OR pyscheduler._refuse_text(VALUE, 'error', 1048576, 'PS312'));
CREATE DOMAIN pyscheduler.check_error AS text
    CHECK (VALUE IS NULL OR pg_catalog.octet_length(VALUE) <= 1048576
           OR pyscheduler._refuse_text(VALUE, 'error', 1048576, 'PS408'));
-- an id the relay read back from delay_messages (delete_fired): whatever the table holds
-- (rows stored before message_id's rule included), so a fired message is always deleted
CREATE DOMAIN pyscheduler.message_ref AS text
    CHECK (VALUE IS NULL OR pg_catalog.octet_length(VALUE) <= 512 OR pyscheduler._refuse_text(VALUE, 'id', 512, 'PS101'));

-- JSON payloads: at most 64 levels deep (the top value is level 1; Python's json recurses
-- about 1,000 deep and orjson.dumps stops at 255, so a payload inside the few levels of an
-- answer, a page or a task's spec stays far from both) and at most 16 MiB stored (the
-- settings task_max_spec_bytes, ... limit them further). A batch (a JSON array or object of
-- payloads) allows one more level per level of wrapping, so a payload accepted alone is
-- accepted in a batch, and 128 MiB.
CREATE DOMAIN pyscheduler.task_spec AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'spec', 64, 16777216, 'PS206'));
CREATE DOMAIN pyscheduler.task_specs AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 65, 134217728)
           OR pyscheduler._refuse_payload(VALUE, 'specs', 65, 134217728, 'PS206'));
CREATE DOMAIN pyscheduler.task_result AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'result', 64, 16777216, 'PS217'));
CREATE DOMAIN pyscheduler.task_results AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 65, 134217728)
           OR pyscheduler._refuse_payload(VALUE, 'results', 65, 134217728, 'PS217'));
CREATE DOMAIN pyscheduler.task_error AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'error', 64, 16777216, 'PS207'));
CREATE DOMAIN pyscheduler.task_errors AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 65, 134217728)
           OR pyscheduler._refuse_payload(VALUE, 'errors', 65, 134217728, 'PS207'));
-- nodes in an array, each node's spec one level below it
CREATE DOMAIN pyscheduler.task_workflow AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 66, 134217728)
           OR pyscheduler._refuse_payload(VALUE, 'workflow', 66, 134217728, 'PS220'));
CREATE DOMAIN pyscheduler.schedule_payload AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'payload', 64, 16777216, 'PS308'));
-- a task-target schedule's options of its tasks (migrations/0035_schedule_task_options.sql)
CREATE DOMAIN pyscheduler.schedule_task_options AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'task_options', 64, 16777216, 'PS312'));
CREATE DOMAIN pyscheduler.check_payload AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'payload', 64, 16777216, 'PS409'));
CREATE DOMAIN pyscheduler.message_headers AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'headers', 64, 16777216, 'PS104'));

-- Durable task functions (0038): a step's and an event's name, an event's payload.
CREATE DOMAIN pyscheduler.step_name AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200) OR pyscheduler._refuse_label(VALUE, 'step', 200, 'PS230'));
CREATE DOMAIN pyscheduler.event_name AS text
    CHECK (VALUE IS NULL OR pyscheduler._label_ok(VALUE, 200) OR pyscheduler._refuse_label(VALUE, 'event', 200, 'PS231'));
CREATE DOMAIN pyscheduler.event_payload AS jsonb
    CHECK (VALUE IS NULL OR pyscheduler._payload_ok(VALUE, 64, 16777216)
           OR pyscheduler._refuse_payload(VALUE, 'payload', 64, 16777216, 'PS232'));
