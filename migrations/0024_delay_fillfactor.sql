-- depends: 0023_schedules_due_index
-- The delay queue's heap keeps a tenth of each page free (issue 21). A claim updates each
-- message (readied_at, readied_by): on a full page its new version went to another page (two
-- pages dirtied per message, the second wherever the free space map pointed), and once fired
-- and vacuumed those left one-row holes across the table, which the next enqueues filled one
-- row per page: 1,000 messages enqueued into 10 million stored dirtied ~500 pages, mostly read
-- back from outside shared buffers (22 us CPU a message against 8-9 us with 10,000 stored;
-- 8.7-8.9 us at 90). At 90 a claim's new version fits on its page, and an insert needs a tenth
-- of a page free besides its row. Deadlines that fire in another order than they were stored
-- still free rows one by one across the table in the long run (a page takes new rows again
-- once a tenth of it and a row are free). Pages written before keep their rows.
ALTER TABLE pyscheduler.delay_messages SET (fillfactor = 90);
-- delay_ready_by_node reads the ready messages' node from the index (an index-only scan where
-- their pages are all-visible: messages a dead node held for a while).
DROP INDEX IF EXISTS pyscheduler.delay_messages_ready_idx;
CREATE INDEX delay_messages_ready_idx ON pyscheduler.delay_messages (readied_at) INCLUDE (readied_by)
    WHERE readied_at IS NOT NULL;
