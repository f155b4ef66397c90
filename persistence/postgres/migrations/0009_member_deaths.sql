-- 0009: a member's death counts against the messages it was running, as a single daemon's
-- unclean stop does (0008). A member registers the name it claims keys with (node) and its
-- member_ttl (ttl_secs). A claim (Store.Claim) that takes a key from a member that died
-- holding it (its registration expired, or a newer member registered its address: the old
-- process is gone) adds 1 to messages.attempts of the key's head pending message, in the
-- claim's transaction: only the first claim after the death sees that owner. owners.previous
-- is the owner a claim replaced. A member that leaves cleanly removes its row, so what it
-- hands on is never counted; an expired row is kept a day (Heartbeat), so a key claimed after
-- a longer outage is not counted.
ALTER TABLE members ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE members ADD COLUMN ttl_secs DOUBLE PRECISION NOT NULL DEFAULT 0;
CREATE INDEX members_node ON members (node) WHERE node <> '';
ALTER TABLE owners ADD COLUMN previous TEXT NOT NULL DEFAULT '';
