-- 0004: a session's own queue mode, set with /queue and kept across passivation and restarts.
ALTER TABLE sessions ADD COLUMN queue_mode TEXT NOT NULL DEFAULT '';
