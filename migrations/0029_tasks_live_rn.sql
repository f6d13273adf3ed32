-- depends: 0028_delay_ready_counts
-- list_tasks(queue => q) with status waiting or scheduled, or with none, pages that queue's
-- live tasks newest first (issue 21) without reading its whole backlog of them: the indexes
-- were (queue) and (queue, run_at), so a page read and sorted all of them (a queue's scheduled
-- tasks can be millions: reminders due next month). tasks_waiting_idx becomes (queue, rn): the
-- same entries in the page's order (it served queue_status' counts, which the tallies keep
-- since 0027). tasks_scheduled_rn_idx is new: a task submitted for later or failed for a
-- retry writes one entry more; the Worker's path (ready -> running -> completed) none. The
-- ready ones are paged per priority from tasks_ready_idx (sql/tasks/5_reads.sql, _ready_page).
-- CREATE INDEX holds off writes to tasks while it reads the table.
DROP INDEX IF EXISTS pyscheduler.tasks_waiting_idx;
CREATE INDEX tasks_waiting_idx ON pyscheduler.tasks (queue, rn) WHERE status = 'waiting';
CREATE INDEX tasks_scheduled_rn_idx ON pyscheduler.tasks (queue, rn) WHERE status = 'scheduled';
