-- 0017: quarantined messages are listed across sessions, newest first (Store.Quarantined, for
-- agentgate sessions quarantined): a partial index holds only them, so the listing reads no
-- other message.
CREATE INDEX IF NOT EXISTS messages_quarantined ON messages (created_at) WHERE status = 'quarantined';
