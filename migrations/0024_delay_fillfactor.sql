-- depends: 0023_schedules_due_index
-- The delay queue's heap keeps a tenth of each page free (issue 21). A claim updates each
-- message (readied_at, readied_by): on a full page the new version went to another page (two
-- pages dirtied per message, the second wherever the free space map pointed, and once fired a
-- one-row hole there). At 90 the new version stays on its page when a claim takes a few
-- messages of it, as it does when deadlines fire in another order than they were stored.
-- Pages written before keep their rows.
ALTER TABLE pyscheduler.delay_messages SET (fillfactor = 90);
-- delay_ready_by_node reads the ready messages' node from the index (an index-only scan where
-- their pages are all-visible: messages a dead node held for a while).
DROP INDEX IF EXISTS pyscheduler.delay_messages_ready_idx;
CREATE INDEX delay_messages_ready_idx ON pyscheduler.delay_messages (readied_at) INCLUDE (readied_by)
    WHERE readied_at IS NOT NULL;
