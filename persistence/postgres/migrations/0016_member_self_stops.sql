-- 0016: a member that stopped itself (its renewals failed for member_ttl: the database was
-- unreachable, slow or failing over, or the process stalled; or the others dropped it) did not
-- die of the message it ran. It cannot say so as it stops, the database being what it lost, so
-- it leaves a note in its data directory, and the next member started there records it
-- (self_stopped) before it registers or claims anything (Store.RecordSelfStops). A claim counts
-- no death of such a member, nor of one whose last renewal is within member_ttl of such a
-- member's: that was an outage all of them met (claimSQL).
ALTER TABLE members ADD COLUMN self_stopped BOOLEAN NOT NULL DEFAULT false;
