-- 0013: the daemon's run (Store.BeginRun, Store.EndRun): run is set when a daemon starts and
-- emptied when it stops cleanly, so a start that finds it set knows the last run died (killed,
-- out of memory, a fatal runtime error) and counts that against the message each session was
-- running (messages.attempts). Two writes per daemon lifetime, none per turn.
-- IF NOT EXISTS: tests that re-run migrations from an earlier version find it.
CREATE TABLE IF NOT EXISTS daemon_run (
    one        INTEGER PRIMARY KEY CHECK (one = 1),
    run        TEXT    NOT NULL DEFAULT '',
    started_at INTEGER
);
INSERT OR IGNORE INTO daemon_run (one, run) VALUES (1, '');
