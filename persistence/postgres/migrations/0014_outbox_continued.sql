-- 0014: an outbox entry says whether the answer to the messages it replies to goes on in a
-- later entry (an automatic reset's notice, which the turn's reply follows; the SQLite store's
-- 0018). A reader of the durable replies to a message (POST /v1/messages?wait for a duplicate,
-- or on a cluster member a relay missed) then knows whether the answer is whole.
ALTER TABLE outbox ADD COLUMN continued BOOLEAN NOT NULL DEFAULT false;
