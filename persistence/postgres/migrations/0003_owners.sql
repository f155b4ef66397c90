-- 0003: who owns each session key (Store.Claim; the SQLite store's 0011): the epoch a write
-- group's Fence is checked against. Rows are never deleted, so a key's epoch never goes back.
CREATE TABLE owners (
    key        TEXT   PRIMARY KEY,
    epoch      BIGINT NOT NULL,
    owner      TEXT   NOT NULL DEFAULT '',
    claimed_at BIGINT
);

-- agentgate_fence fails the statement with SQLSTATE AG001 when key has been claimed with an
-- epoch newer than e. It reads the owner row FOR SHARE: a claim (an UPDATE of the row) waits
-- until the transaction that passed the fence ends, and a fence that meets a claim in progress
-- waits for it and then reads the new epoch. So no write fenced with an older epoch commits
-- after a claim.
CREATE FUNCTION agentgate_fence(k TEXT, e BIGINT) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cur BIGINT;
BEGIN
    SELECT epoch INTO cur FROM owners WHERE key = k FOR SHARE;
    IF cur > e THEN
        RAISE EXCEPTION 'session key % is claimed with epoch %, this write has epoch %', k, cur, e
            USING ERRCODE = 'AG001';
    END IF;
END
$$;
