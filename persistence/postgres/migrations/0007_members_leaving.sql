-- 0007: a member that stops says so before it drains (Store.Heartbeat with Member.Leaving). It
-- stays a member, and the others keep routing its keys to it, until its drain ends and it
-- removes its row, or its row expires: a key whose turn it is still finishing is never
-- activated elsewhere meanwhile. The others only leave it out of the members they hand keys
-- on to when they leave themselves.
ALTER TABLE members ADD COLUMN leaving BOOLEAN NOT NULL DEFAULT false;
