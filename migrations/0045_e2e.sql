-- depends: 0043_schedule_minutes
-- The spec index's pending list (issue 31, end to end): an insert adds its GIN entries to the
-- index's pending list, and the insert that fills it merges the whole list into the index. Every
-- lease and completion writes the task's entries again (they change status, an indexed column:
-- not HOT), so at 11,400 tasks/s submitted and worked the default 4 MB list filled every ~3 s
-- and one submit, lease or completion then spent ~85-100 ms merging it: the end-to-end start
-- p99 was that pause (60 ms, max 104-120 ms). Merged at 256 kB the pauses are ~10 ms and the
-- p99 16-32 ms, the capacity unchanged (docs/benchmarks.md, issue 31).
ALTER INDEX pyscheduler.tasks_spec_idx SET (gin_pending_list_limit = 256);
