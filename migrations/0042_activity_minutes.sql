-- depends: 0041_delay_fired_minutes
-- Long dashboard ranges without reading the tasks (issue 30): per minute, the tasks finished
-- per status (per queue: by the hour) and a histogram of their due-to-started latency, folded now and then by
-- _fold_task_minutes (called by cleanup_tasks, the tasks monitor's minutely job) from
-- tasks_terminal_updated_idx, up to _task_minutes_folded.upto; minutes older than 8 days
-- are deleted by the fold. activity(), activity_latency() and queue_activity() read it for
-- ranges of a day or more and the index for what ended since.
CREATE TABLE pyscheduler._task_minutes (
    minute timestamptz NOT NULL,
    status text        NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, status)
);
-- per queue by the hour (a minute per queue would be a row per task at a few tasks a minute)
CREATE TABLE pyscheduler._task_queue_hours (
    hour   timestamptz NOT NULL,
    queue  text        NOT NULL,
    status text        NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (hour, queue, status)
);
CREATE TABLE pyscheduler._task_latency_minutes (
    minute timestamptz NOT NULL,
    k      smallint    NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, k)
);
CREATE TABLE pyscheduler._task_minutes_folded (
    one  boolean     PRIMARY KEY DEFAULT true CHECK (one),
    upto timestamptz
);
INSERT INTO pyscheduler._task_minutes_folded (upto) VALUES (NULL);
