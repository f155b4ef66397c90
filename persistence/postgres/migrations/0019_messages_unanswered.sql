-- 0019: the unanswered user messages of a session (any status but done, failed and quarantined:
-- a garbage one counts) are found without reading its other messages: a prune step checks a
-- session for them before it deletes anything of it, and checks a session too large for one
-- step again at each of its steps (PostgreSQL only: SQLite's steps check a session once). The
-- predicate is pruneDueSQL's, word for word, so that the planner takes the index for it.
CREATE INDEX messages_unanswered ON messages (session_id)
    WHERE role = 'user' AND active AND status NOT IN ('done', 'failed', 'quarantined');
