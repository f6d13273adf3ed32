-- depends: 0023_schedules_due_index
-- The delay queue's heap keeps room (issue 21). A message leaves its page when it is fired
-- (and its older version when a relay claims it), one here, one there: vacuum marks each such
-- hole in the free space map, and at fillfactor 100 the next enqueue filled them, one row per
-- page: 1,000 messages enqueued into a table of 10 million dirtied ~500 pages, mostly read
-- back from outside shared buffers (24 us a message against 9 us with 10,000 stored). At 90 an
-- insert needs a tenth of a page free besides its row, so it goes where rows left together
-- (the tail, pages of messages fired together) and a claim's new version fits on its page.
-- Pages written before keep their rows; new ones are written at 90 %.
ALTER TABLE pyscheduler.delay_messages SET (fillfactor = 90);
-- delay_ready_by_node reads the ready messages' node from the index (an index-only scan where
-- their pages are all-visible: messages a dead node held for a while).
DROP INDEX IF EXISTS pyscheduler.delay_messages_ready_idx;
CREATE INDEX delay_messages_ready_idx ON pyscheduler.delay_messages (readied_at) INCLUDE (readied_by)
    WHERE readied_at IS NOT NULL;
