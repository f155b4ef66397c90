-- 0018: a session records an automatic reset that fell due while it had work in hand (a turn
-- running, messages waiting; the SQLite store's 0019): the reason (idle or daily; '' when none is
-- due) and the due time. The session ends at that time once the work is done, also on the member
-- or in the run that loads it next. Ending or reopening the session clears it.
ALTER TABLE sessions ADD COLUMN reset_due_at BIGINT;
ALTER TABLE sessions ADD COLUMN reset_due_reason TEXT NOT NULL DEFAULT '';
