-- 0013: quarantined messages are listed across sessions, newest first (Store.Quarantined, for
-- agentgate sessions quarantined; the SQLite store's 0017): a partial index holds only them, so
-- the listing reads no other message.
CREATE INDEX messages_quarantined ON messages (created_at) WHERE status = 'quarantined';
