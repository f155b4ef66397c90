-- 0021: the daemon lock's fence (0006) checks the raise's id (0020) too, when the commit's store
-- raised the epoch it fences with (a single daemon's: r, its raise's id; a cluster member's
-- read epoch has none, r NULL, and is checked as before). A database restored, or failed over
-- to a standby, to a point before a daemon's raise may have the epoch raised to the same number
-- by another daemon since; the epoch alone let the first daemon's commits in flight through
-- beside the other's until its next check of the lock found it lost. The message keeps 0006's
-- words for an epoch that differs; one of the same epoch under another raise names no epoch it
-- took, so that it is not read as a retake of the daemon's own (describe).
-- agentgate_daemon_fence(e) stays for a binary of the previous version still running.
CREATE FUNCTION agentgate_daemon_fence(e BIGINT, r TEXT) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cur BIGINT;
    rid TEXT;
BEGIN
    SELECT epoch, raise_id INTO cur, rid FROM daemon_epoch FOR SHARE;
    IF cur IS DISTINCT FROM e THEN
        RAISE EXCEPTION 'the daemon lock is held with epoch %, this daemon took epoch %', cur, e
            USING ERRCODE = 'AG002';
    END IF;
    IF r IS NOT NULL AND rid IS DISTINCT FROM r THEN
        RAISE EXCEPTION 'the daemon lock is held with epoch % raised by another process than this daemon, which raised it to the same number (the database was restored or failed over to a point before this daemon''s raise)', cur
            USING ERRCODE = 'AG002';
    END IF;
END
$$;
