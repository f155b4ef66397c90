-- 0016: the sender of the user messages stored before 0002. 0002 added messages.user_id and
-- user_name with '' for the rows already there, and a session loads a pending message's sender
-- from them (every queued message keeps its own sender): a message that a build of the 0001
-- schema left pending (killed mid-turn, or queued behind it) ran after the upgrade with an
-- empty user id and name, in AGENTGATE_USER_ID, on the agent's stdin and in its reply's outbox
-- entry. Such a message came from its session's user only where the session's key names that
-- user: a group, channel or thread session per user. A shared session has no user (its row's
-- user is ''), and a DM is keyed by its chat alone: the HTTP API took any user_id in a DM and
-- ran each turn as its message's sender, so the DM's row names only its first sender. Those
-- old messages' senders are unknown: they stay '' (an unknown sender, never another user's).
UPDATE messages
   SET user_id   = (SELECT s.user_id FROM sessions s WHERE s.id = messages.session_id),
       user_name = (SELECT s.user_name FROM sessions s WHERE s.id = messages.session_id)
 WHERE role = 'user' AND user_id = ''
   AND (SELECT s.user_id FROM sessions s
         WHERE s.id = messages.session_id AND s.chat_type IN ('group', 'channel', 'thread')) <> '';
