-- 0008: the single daemon's run (Store.BeginRun, Store.EndRun): run is set when a daemon starts
-- and emptied when it stops cleanly, so a start that finds it set knows the last run died
-- (killed, out of memory, a fatal runtime error) and counts that against the message each
-- session was running (messages.attempts). Two writes per daemon lifetime, none per turn.
-- Cluster members (a shared store) never touch it.
CREATE TABLE daemon_run (
    one        BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    run        TEXT    NOT NULL DEFAULT '',
    started_at BIGINT
);
INSERT INTO daemon_run (one, run) VALUES (TRUE, '');
