-- 0015: whether the daemon lock's epoch (0006) was last raised by a single daemon, which holds
-- the lock exclusively. A cluster member that takes the lock shared after one raises the epoch
-- once more (the first of the members to do so), so that the single daemon's commits, which
-- fence with the epoch it raised, are refused even before its next check of the lock finds the
-- lock gone; the other members read the epoch as before. An existing row says no: its holder
-- is not known, and a raise by a member that upgrades beside members of the previous version,
-- which only read the epoch once, would refuse their commits for good.
ALTER TABLE daemon_epoch ADD COLUMN exclusive BOOLEAN NOT NULL DEFAULT false;
