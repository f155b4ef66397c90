-- 0007: one index of the undelivered outbox entries instead of two. Every reply was inserted into
-- both and its delivery mark deleted it from both: two index pages written per reply and per mark
-- for the same information. What is not delivered (pending, failed, or any other value, which
-- errs on the side of sending again and of keeping a session) is found by key; a session's
-- entries carry its key, so the retention check looks them up by key too.
DROP INDEX IF EXISTS outbox_session_undelivered;
DROP INDEX IF EXISTS outbox_undelivered;
CREATE INDEX outbox_undelivered ON outbox (session_key, seq) WHERE state <> 'delivered';
