-- 0006: the epoch of the daemon lock (Options.Exclusive). A daemon that takes the lock raises
-- the epoch, and every commit of an exclusive store starts with agentgate_daemon_fence of the
-- epoch it took: a daemon whose lock connection died and whose lock another daemon has taken
-- since commits nothing more, even before it has noticed.
CREATE TABLE daemon_epoch (
    one   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    epoch BIGINT  NOT NULL
);
INSERT INTO daemon_epoch (one, epoch) VALUES (TRUE, 0);

-- agentgate_daemon_fence fails the statement with SQLSTATE AG002 unless the daemon lock's epoch
-- is e. It reads the epoch FOR SHARE: a daemon raising it (an UPDATE of the row) waits until
-- the commits that passed the fence end, and a fence that meets a raise in progress waits for
-- it and then reads the new epoch. So no commit of the lock's previous holder ends after the
-- new holder has raised the epoch.
CREATE FUNCTION agentgate_daemon_fence(e BIGINT) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cur BIGINT;
BEGIN
    SELECT epoch INTO cur FROM daemon_epoch FOR SHARE;
    IF cur IS DISTINCT FROM e THEN
        RAISE EXCEPTION 'the daemon lock is held with epoch %, this daemon took epoch %', cur, e
            USING ERRCODE = 'AG002';
    END IF;
END
$$;
