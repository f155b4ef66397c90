-- 0012: an outbox entry in state 'failed' is final: the platform refused it for good (the
-- channel is gone, the bot may not post there), so it is not sent again at the next start and
-- does not keep its session from being pruned. Only 'pending' entries are undelivered. Before,
-- 'failed' also meant "gave up after five quick attempts", for errors that may pass; those
-- entries (and any in a state no version writes) become pending again, so the next start sends them once more under the new rules
-- (a send that may succeed is retried until it does).
UPDATE outbox SET state = 'pending' WHERE state <> 'delivered' AND state <> 'pending';
DROP INDEX outbox_undelivered;
CREATE INDEX outbox_undelivered ON outbox (session_key, seq) WHERE state = 'pending';
