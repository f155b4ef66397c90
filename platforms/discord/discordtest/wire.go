package discordtest

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/bwmarrin/discordgo"
)

// discordEpochMillis is the Unix time in milliseconds at which snowflakes start (2015).
const discordEpochMillis = 1420070400000

// clockBase is the fake clock's zero. Every tick advances it one millisecond, so IDs and
// timestamps are the same on every run and SnowflakeTimestamp(id) matches the timestamp.
var clockBase = time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)

// tickLocked advances the fake clock and returns the new time and a snowflake made from it.
func (s *Server) tickLocked() (time.Time, string) {
	s.ticks++
	t := s.nowLocked()
	return t, strconv.FormatInt((t.UnixMilli()-discordEpochMillis)<<22, 10)
}

// discordTime formats t the way Discord's API does.
func discordTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000000+00:00")
}

// message is a message of the fake world, posted by a user or by the bot.
type message struct {
	id, channelID, guildID string
	author                 User
	nick                   string
	content                string
	posted                 string // the content as the bot's request carried it, before Discord's stripping (a bot's message)
	embeds                 []json.RawMessage
	flags                  int
	typ                    discordgo.MessageType
	mentions               []User
	mentionEveryone        bool
	mentionRoles           []string
	ref                    *message // the message this one replies to
	nonce                  string
	created                time.Time
	edited                 *time.Time
}

func (s *Server) storeLocked(m *message) {
	s.messages[m.id] = m
	s.history[m.channelID] = append(s.history[m.channelID], m)
}

// visibleAll shows every message's content; session.visible applies MESSAGE_CONTENT.
func visibleAll(*message) bool { return true }

// dispatchMessageLocked sends a MESSAGE_CREATE or MESSAGE_UPDATE to the session if its
// intents ask for messages of that kind.
func (s *Server) dispatchMessageLocked(event string, m *message) {
	sess := s.sess
	if sess == nil {
		return
	}
	want := discordgo.IntentsGuildMessages
	if m.guildID == "" {
		want = discordgo.IntentsDirectMessages
	}
	if sess.intents&want == 0 {
		return
	}
	visible := func(x *message) bool {
		return sess.intents&discordgo.IntentsMessageContent != 0 || x.guildID == "" ||
			x.author.ID == s.bot.ID || hasUser(x.mentions, s.bot.ID)
	}
	s.dispatchLocked(event, s.messageWire(m, true, visible))
}

// messageWire renders m as Discord's JSON. The gateway form adds guild_id and member;
// content, embeds and the like are blanked where visible says the client may not see them.
func (s *Server) messageWire(m *message, gateway bool, visible func(*message) bool) map[string]any {
	w := map[string]any{
		"id":               m.id,
		"channel_id":       m.channelID,
		"author":           m.author.wire(),
		"content":          "",
		"timestamp":        discordTime(m.created),
		"edited_timestamp": nil,
		"tts":              false,
		"mention_everyone": m.mentionEveryone,
		"mentions":         usersWire(m.mentions),
		"mention_roles":    append([]string{}, m.mentionRoles...),
		"attachments":      []any{},
		"embeds":           []any{},
		"components":       []any{},
		"pinned":           false,
		"type":             m.typ,
		"flags":            m.flags,
	}
	if visible(m) {
		w["content"] = m.content
		if m.embeds != nil {
			w["embeds"] = m.embeds
		}
	}
	if m.edited != nil {
		w["edited_timestamp"] = discordTime(*m.edited)
	}
	if m.nonce != "" {
		w["nonce"] = m.nonce
	}
	if gateway && m.guildID != "" {
		w["guild_id"] = m.guildID
		member := map[string]any{
			"roles": []string{}, "joined_at": discordTime(clockBase), "deaf": false, "mute": false, "flags": 0,
		}
		if m.nick != "" {
			member["nick"] = m.nick
		}
		w["member"] = member
	}
	if m.ref != nil {
		ref := map[string]any{"type": 0, "message_id": m.ref.id, "channel_id": m.ref.channelID}
		if m.ref.guildID != "" {
			ref["guild_id"] = m.ref.guildID
		}
		w["message_reference"] = ref
		referenced := *m.ref
		referenced.ref = nil // Discord does not nest referenced messages
		w["referenced_message"] = s.messageWire(&referenced, false, visible)
	}
	return w
}

func (u User) wire() map[string]any {
	w := map[string]any{
		"id": u.ID, "username": u.Username, "global_name": nil, "discriminator": "0", "avatar": nil, "public_flags": 0,
	}
	if u.GlobalName != "" {
		w["global_name"] = u.GlobalName
	}
	if u.Bot {
		w["bot"] = true
	}
	return w
}

func usersWire(us []User) []any {
	out := make([]any, len(us))
	for i, u := range us {
		out[i] = u.wire()
	}
	return out
}

func hasUser(us []User, id string) bool {
	for _, u := range us {
		if u.ID == id {
			return true
		}
	}
	return false
}

func appendUser(us []User, u User) []User {
	if hasUser(us, u.ID) {
		return us
	}
	return append(us, u)
}

func isThread(t discordgo.ChannelType) bool {
	return t == discordgo.ChannelTypeGuildPublicThread || t == discordgo.ChannelTypeGuildPrivateThread ||
		t == discordgo.ChannelTypeGuildNewsThread
}

// channelWireLocked renders c as Discord's channel object.
func (s *Server) channelWireLocked(c *Channel) map[string]any {
	w := map[string]any{
		"id": c.ID, "type": c.Type, "last_message_id": nil, "flags": 0,
	}
	if last := s.history[c.ID]; len(last) > 0 {
		w["last_message_id"] = last[len(last)-1].id
	}
	if c.GuildID == "" {
		var recipients []User
		for _, m := range s.history[c.ID] {
			if m.author.ID != s.bot.ID {
				recipients = appendUser(recipients, m.author)
			}
		}
		w["recipients"] = usersWire(recipients)
		return w
	}
	w["guild_id"] = c.GuildID
	w["name"] = c.Name
	w["parent_id"] = nil
	if c.ParentID != "" {
		w["parent_id"] = c.ParentID
	}
	w["rate_limit_per_user"] = 0
	if isThread(c.Type) {
		w["owner_id"] = c.OwnerID
		w["message_count"] = len(s.history[c.ID])
		w["member_count"] = 1
		w["thread_metadata"] = map[string]any{
			"archived": c.Archived, "auto_archive_duration": 1440, "archive_timestamp": discordTime(clockBase),
			"locked": false,
		}
		return w
	}
	w["position"] = 0
	w["permission_overwrites"] = []any{}
	w["nsfw"] = false
	w["topic"] = nil
	return w
}

// guildWireLocked renders the GUILD_CREATE payload of g: its channels, its threads and the
// bot as its only member.
func (s *Server) guildWireLocked(g *guild) map[string]any {
	channels, threads := []any{}, []any{}
	for _, c := range s.channels {
		if c.GuildID != g.id {
			continue
		}
		if isThread(c.Type) {
			if !c.Archived { // GUILD_CREATE lists the active threads only
				threads = append(threads, s.channelWireLocked(c))
			}
		} else {
			channels = append(channels, s.channelWireLocked(c))
		}
	}
	botRoles := []string{}
	for _, r := range g.roles {
		if r.BotID == s.bot.ID {
			botRoles = append(botRoles, r.ID)
		}
	}
	return map[string]any{
		"id": g.id, "name": g.name, "unavailable": false, "large": false, "member_count": 1,
		"joined_at": discordTime(g.joined),
		"channels":  channels,
		"threads":   threads,
		"roles":     guildRolesWire(g),
		"members": []any{map[string]any{
			"user": s.bot.wire(), "roles": botRoles, "joined_at": discordTime(g.joined), "deaf": false, "mute": false,
		}},
		"presences": []any{}, "voice_states": []any{}, "emojis": []any{}, "stickers": []any{},
	}
}

// guildRolesWire renders g's roles as Discord lists them: @everyone (the guild's id) first.
func guildRolesWire(g *guild) []any {
	roles := []any{roleWire(Role{ID: g.id, Name: "@everyone"}, 0)}
	for i, r := range g.roles {
		roles = append(roles, roleWire(r, i+1))
	}
	return roles
}

// roleWire renders r as Discord's role object; a bot's role is managed, and tagged with its bot.
func roleWire(r Role, position int) map[string]any {
	w := map[string]any{
		"id": r.ID, "name": r.Name, "color": 0, "hoist": false, "icon": nil, "unicode_emoji": nil,
		"position": position, "permissions": "0", "managed": r.BotID != "", "mentionable": false, "flags": 0,
	}
	if r.BotID != "" {
		w["tags"] = map[string]any{"bot_id": r.BotID}
	}
	return w
}

// decodeMessage turns a rendered message into what discordgo makes of it.
func decodeMessage(w map[string]any) *discordgo.Message {
	b, err := json.Marshal(w)
	if err != nil {
		panic(fmt.Sprintf("discordtest: encode message: %v", err))
	}
	var m discordgo.Message
	if err := json.Unmarshal(b, &m); err != nil {
		panic(fmt.Sprintf("discordtest: decode message: %v", err))
	}
	return &m
}
