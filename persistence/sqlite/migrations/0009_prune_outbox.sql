-- 0009: pruning deletes a session's outbox entries too (prune.go); before, they stayed forever,
-- reply text included, after the session and its transcript were gone. This removes what
-- sessions pruned before left behind, the same way: every delivered entry of a session that no
-- longer exists goes, except its key's last, which keeps its seq (the key's next reply continues
-- it, and it is the SSE event id) and loses its kind, its text and the ids it answered.
DELETE FROM outbox
 WHERE session_id <> '' AND state = 'delivered'
   AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = outbox.session_id)
   AND seq < (SELECT MAX(o.seq) FROM outbox o WHERE o.session_key = outbox.session_key);
UPDATE outbox SET kind = 'pruned', text = '', in_reply_to = '[]'
 WHERE session_id <> '' AND state = 'delivered'
   AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = outbox.session_id);
