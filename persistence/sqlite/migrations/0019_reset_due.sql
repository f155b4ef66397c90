-- 0019: a session records an automatic reset that fell due while it had work in hand (a turn
-- running, messages waiting): the reason (idle or daily; '' when none is due) and the due time.
-- The session ends at that time once the work is done, also in a later run that loads it:
-- before, the reset was kept in memory only, and a stop of the daemon before the work was done
-- lost it (the work moved the session's activity past the due time). Ending or reopening the
-- session clears it.
ALTER TABLE sessions ADD COLUMN reset_due_at INTEGER;
ALTER TABLE sessions ADD COLUMN reset_due_reason TEXT NOT NULL DEFAULT '';
