-- The sender of each user message: in a shared session every queued message keeps its own
-- sender, so the turn that answers it (also after a restart) runs with that sender's identity.
ALTER TABLE messages ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN user_name TEXT NOT NULL DEFAULT '';
