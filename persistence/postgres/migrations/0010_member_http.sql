-- 0010: a member registers the address of its HTTP API (http_addr), so that admin commands
-- run anywhere (`agentgate sessions reset`) can ask a live member to act for them: the member
-- routes the request to the session's owner, whose own reset cancels a turn it runs.
ALTER TABLE members ADD COLUMN http_addr TEXT NOT NULL DEFAULT '';
