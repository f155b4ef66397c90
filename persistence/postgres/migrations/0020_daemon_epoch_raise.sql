-- 0020: which raise of the daemon lock's epoch (0006) set it: a random id each exclusive store
-- draws for each raise it makes (NULL once a cluster member raised it, and on an existing row).
-- A daemon that takes its lock again after losing it keeps its epoch, rather than raise it,
-- when the row still holds the epoch, the id and the exclusive mark of its own last raise: no
-- other process held the lock in between with its epoch raised, so no other one can have
-- written, and its own commits in flight, fenced with that epoch, go through rather than be
-- spooled. The id, not only the epoch, makes that sure after a restore of the database to a
-- point before this daemon's raise, when another daemon may have raised the epoch to the same
-- number since.
ALTER TABLE daemon_epoch ADD COLUMN raise_id TEXT;
