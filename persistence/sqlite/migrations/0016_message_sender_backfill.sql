-- 0016: the sender of the user messages stored before 0002. 0002 added messages.user_id and
-- user_name with '' for the rows already there, and a session loads a pending message's sender
-- from them (every queued message keeps its own sender): a message that a build of the 0001
-- schema left pending (killed mid-turn, or queued behind it) ran after the upgrade with an
-- empty user id and name, in AGENTGATE_USER_ID, on the agent's stdin and in its reply's outbox
-- entry. Such a message came from its session's user whenever the session has one: a DM, or a
-- group session per user, is keyed by that user. A shared session has none (its row's user is
-- ''), and its old messages' senders are unknown: they stay ''.
UPDATE messages
   SET user_id   = (SELECT s.user_id FROM sessions s WHERE s.id = messages.session_id),
       user_name = (SELECT s.user_name FROM sessions s WHERE s.id = messages.session_id)
 WHERE role = 'user' AND user_id = ''
   AND (SELECT s.user_id FROM sessions s WHERE s.id = messages.session_id) <> '';
