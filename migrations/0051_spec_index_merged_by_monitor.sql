-- depends: 0050_delay_headers_inline
-- The spec index's pending list is merged by the tasks monitor (merge_task_search_index, every
-- reset_interval), not by the write that fills it (issue 31): at 256 kB (0045) the submits,
-- leases and completions paid every merge, ~1.4 us of a bulk submit's ~11 us a task. 4 MB
-- (PostgreSQL's default) is the bound when no monitor merges: the write that fills it does.
ALTER INDEX pyscheduler.tasks_spec_idx SET (gin_pending_list_limit = 4096);
