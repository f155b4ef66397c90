-- 0017: the epoch of each lease (Store.Lease). The process that takes a lease raises its epoch,
-- on the lease's connection, right after it took the lease's advisory lock, and the records it
-- keeps as the lease's holder change only while the epoch is still the one it raised
-- (agentgate_lease_held): the clear of a Discord unread place (persistence.ClearUnread), which
-- the holder of the platform's gateway lease writes. A holder whose lease connection died, or
-- whose session the server ended while it stalled, and whose lease another member has taken
-- since, clears no place the new holder loaded to read from, even before it has noticed.
CREATE TABLE leases (
    name  TEXT   PRIMARY KEY,
    epoch BIGINT NOT NULL
);

-- agentgate_lease_held is true while lease n's epoch is e (never, for a lease never taken). It
-- reads the epoch FOR SHARE: a new holder raising it (an UPDATE of the row) waits until the
-- transactions that found it held end, and one that meets a raise in progress waits for it and
-- then reads the new epoch. So no write that it let through commits after the lease's next
-- holder raised the epoch.
CREATE FUNCTION agentgate_lease_held(n TEXT, e BIGINT) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    cur BIGINT;
BEGIN
    SELECT epoch INTO cur FROM leases WHERE name = n FOR SHARE;
    RETURN cur IS NOT DISTINCT FROM e;
END
$$;
