-- 0003: indexes for the durable reset timer (IdleSessions) and for retention (PruneSessions).
-- From this version on, rows are deleted in one place only: PruneSessions deletes sessions that
-- ended before the retention cutoff, with their messages and search index entries, once nothing
-- needs them any more. Routing and outbox rows are never deleted.

-- Open sessions by last activity, oldest first (IdleSessions).
CREATE INDEX sessions_open_activity ON sessions (last_activity_at, id) WHERE ended_at IS NULL;

-- Ended sessions by end time, oldest first (PruneSessions).
CREATE INDEX sessions_ended ON sessions (ended_at, id) WHERE ended_at IS NOT NULL;

-- The keys that route to a session: a routed session is never pruned.
CREATE INDEX routing_session ON routing (session_id);

-- Undelivered outbox entries of a session: such a session is never pruned.
CREATE INDEX outbox_session_undelivered ON outbox (session_id) WHERE state <> 'delivered';
