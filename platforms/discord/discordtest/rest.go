package discordtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/bwmarrin/discordgo"
)

// maxContent is Discord's limit on message content, in characters.
const maxContent = 2000

// A handler serves one REST route and returns the status and the JSON body (nil for none).
type handler func(r *http.Request) (int, any)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/gateway", s.serveGateway)
	mux.HandleFunc("/gateway/", s.serveGateway) // discordgo appends a slash
	mux.Handle("GET /api/v9/gateway", s.api(false, s.getGateway))
	mux.Handle("GET /api/v9/gateway/bot", s.api(true, s.getGatewayBot))
	mux.Handle("GET /api/v9/users/@me", s.api(true, s.getMe))
	mux.Handle("GET /api/v9/guilds/{guild}/roles", s.api(true, s.getRoles))
	mux.Handle("GET /api/v9/channels/{channel}", s.api(true, s.getChannel))
	mux.Handle("GET /api/v9/channels/{channel}/messages", s.api(true, s.getMessages))
	mux.Handle("POST /api/v9/channels/{channel}/messages", s.api(true, s.postMessage))
	mux.Handle("PATCH /api/v9/channels/{channel}/messages/{message}", s.api(true, s.editMessage))
	mux.Handle("DELETE /api/v9/channels/{channel}/messages/{message}", s.api(true, s.deleteMessage))
	mux.Handle("POST /api/v9/channels/{channel}/typing", s.api(true, s.postTyping))
	mux.Handle("POST /api/v9/channels/{channel}/messages/{message}/threads", s.api(true, s.startThread))
	mux.Handle("/", s.api(true, func(*http.Request) (int, any) {
		return http.StatusNotFound, apiError("404: Not Found", 0)
	}))
	return mux
}

func (s *Server) api(auth bool, h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		status, body := s.serveAPI(r, auth, h)
		if b, ok := body.(edgeBlock); ok {
			b.write(w) // the edge's, not Discord's: none of Discord's headers
			return
		}
		hdr := w.Header()
		// Generous values with a near reset, so discordgo's limiter never waits on its own.
		remaining, resetAfter, global := "4", 0.001, false
		if status == http.StatusTooManyRequests {
			remaining, resetAfter = "0", retryAfter
			if b, ok := body.(map[string]any); ok {
				resetAfter, _ = b["retry_after"].(float64) // the bucket resets when the wait ends
				global, _ = b["global"].(bool)
			}
			hdr.Set("Retry-After", strconv.Itoa(int(math.Ceil(resetAfter)))) // whole seconds, as Discord sends; discordgo reads the body
			hdr.Set("X-RateLimit-Scope", "user")
		}
		if global {
			// Discord's global 429 names no route: no bucket, no remaining, no reset.
			hdr.Set("X-RateLimit-Global", "true")
			hdr.Set("X-RateLimit-Scope", "global")
		} else {
			hdr.Set("X-RateLimit-Bucket", bucket(r))
			hdr.Set("X-RateLimit-Limit", "5")
			hdr.Set("X-RateLimit-Remaining", remaining)
			hdr.Set("X-RateLimit-Reset-After", strconv.FormatFloat(resetAfter, 'f', 3, 64))
			reset := float64(time.Now().UnixMilli())/1000 + resetAfter
			hdr.Set("X-RateLimit-Reset", strconv.FormatFloat(reset, 'f', 3, 64))
		}
		if body == nil {
			w.WriteHeader(status)
			return
		}
		hdr.Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(mustJSON(body))
	})
}

func (s *Server) serveAPI(r *http.Request, auth bool, h handler) (int, any) {
	s.mu.Lock()
	s.requests[r.Method+" "+r.URL.Path]++
	s.notifyLocked()
	s.mu.Unlock()
	if auth && r.Header.Get("Authorization") != "Bot "+s.token {
		return http.StatusUnauthorized, apiError("401: Unauthorized", 0)
	}
	f := s.takeFault(r)
	if f != nil && f.hold != nil {
		s.logf("rest: %s %s: held", r.Method, r.URL.Path)
		<-f.hold
		f = nil
	}
	if f != nil && !f.after {
		s.logf("rest: %s %s: injected %d", r.Method, r.URL.Path, f.status)
		return faultResponse(f)
	}
	status, body := h(r)
	if f != nil {
		s.logf("rest: %s %s: answered %d, replaced by injected %d", r.Method, r.URL.Path, status, f.status)
		return faultResponse(f)
	}
	return status, body
}

func bucket(r *http.Request) string {
	h := fnv.New64a()
	io.WriteString(h, r.Pattern)
	return fmt.Sprintf("%016x", h.Sum64())
}

func apiError(msg string, code int) map[string]any {
	return map[string]any{"message": msg, "code": code}
}

// invalidForm is Discord's 400 for a field that fails validation.
func invalidForm(field, code, msg string) (int, any) {
	return http.StatusBadRequest, map[string]any{
		"message": "Invalid Form Body", "code": 50035,
		"errors": map[string]any{field: map[string]any{"_errors": []any{map[string]any{"code": code, "message": msg}}}},
	}
}

var (
	errUnknownChannel = apiError("Unknown Channel", 10003)
	errUnknownMessage = apiError("Unknown Message", 10008)
)

// decodeBody reads a JSON body; ok is false when it is not JSON.
func decodeBody(r *http.Request, v any) bool {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return true
	}
	return json.Unmarshal(b, v) == nil
}

var errInvalidJSON = apiError("The request body contains invalid JSON.", 50109)

func (s *Server) getGateway(*http.Request) (int, any) {
	return http.StatusOK, map[string]any{"url": s.wsURL}
}

func (s *Server) getGatewayBot(*http.Request) (int, any) {
	return http.StatusOK, map[string]any{
		"url": s.wsURL, "shards": 1,
		"session_start_limit": map[string]any{"total": 1000, "remaining": 999, "reset_after": 14400000, "max_concurrency": 1},
	}
}

func (s *Server) getMe(*http.Request) (int, any) {
	return http.StatusOK, s.bot.wire()
}

// getRoles lists a guild's roles, as Get Guild Roles does.
func (s *Server) getRoles(r *http.Request) (int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.guildByID[r.PathValue("guild")]
	if g == nil {
		return http.StatusNotFound, apiError("Unknown Guild", 10004)
	}
	return http.StatusOK, guildRolesWire(g)
}

func (s *Server) getChannel(r *http.Request) (int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chanByID[r.PathValue("channel")]
	if c == nil {
		return http.StatusNotFound, errUnknownChannel
	}
	return http.StatusOK, s.channelWireLocked(c)
}

// getMessages lists a channel's messages as Discord's Get Channel Messages does: limit (1–100,
// default 50) of them, newest first, in the REST form (no guild_id, no member, no nonce: Discord
// keeps a message's nonce for its create only). With after, the
// first messages after the given id; with before, the newest ones older than it; without
// either, the newest.
func (s *Server) getMessages(r *http.Request) (int, any) {
	q := r.URL.Query()
	limit := 50
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return http.StatusBadRequest, apiError("Invalid Form Body", 50035)
		}
		limit = n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.chanByID[r.PathValue("channel")] == nil {
		return http.StatusNotFound, errUnknownChannel
	}
	h := s.history[r.PathValue("channel")] // in creation order: ids ascend
	var page []*message
	switch after, before := q.Get("after"), q.Get("before"); {
	case after != "":
		for _, m := range h {
			if snowflakeLess(after, m.id) && len(page) < limit {
				page = append(page, m)
			}
		}
	case before != "": // the newest limit messages older than before
		end := len(h)
		for end > 0 && !snowflakeLess(h[end-1].id, before) {
			end--
		}
		page = h[max(end-limit, 0):end]
	default:
		page = h[max(len(h)-limit, 0):]
	}
	out := make([]map[string]any, len(page))
	for i, m := range page {
		w := s.messageWire(m, false, visibleAll)
		delete(w, "nonce") // only the answer to the post and its MESSAGE_CREATE carry it
		out[len(page)-1-i] = w
	}
	return http.StatusOK, out
}

// snowflakeLess orders two snowflakes (decimal strings without leading zeros).
func snowflakeLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// discordStrip returns content as Discord keeps it. Discord strips characters it takes for
// invalid or for breaking a message's formatting before it reads the content (the warning on
// Create Message in its API docs; discord-api-docs#1189, a staff answer: "Unicode control
// characters get stripped"), and refuses a message left empty (50006). It does not say which;
// the fake strips the control characters (C0, DEL, C1) but tab, line feed, carriage return and
// ESC (Discord's ansi code blocks colour text with ESC's codes), and the bidirectional
// overrides and isolates (U+202A to U+202E, U+2066 to U+2069, discord-api-docs#1189). A body
// that is not valid UTF-8, which Discord answers 400 (code 0, discord-api-docs#1197), never
// comes from discordgo: encoding/json writes U+FFFD for such bytes.
func discordStrip(content string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r' || r == '\x1b':
			return r
		case unicode.IsControl(r), r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069':
			return -1
		}
		return r
	}, content)
}

// allowedMentions is the allowed_mentions object of a message body.
type allowedMentions struct {
	Parse       []string `json:"parse"`
	Users       []string `json:"users"`
	Roles       []string `json:"roles"`
	RepliedUser bool     `json:"replied_user"`
}

func (s *Server) postMessage(r *http.Request) (int, any) {
	var body struct {
		Content          string                      `json:"content"`
		Embeds           []json.RawMessage           `json:"embeds"`
		Flags            int                         `json:"flags"`
		Nonce            json.RawMessage             `json:"nonce"`
		EnforceNonce     bool                        `json:"enforce_nonce"`
		MessageReference *discordgo.MessageReference `json:"message_reference"`
		AllowedMentions  *allowedMentions            `json:"allowed_mentions"`
	}
	if !decodeBody(r, &body) {
		return http.StatusBadRequest, errInvalidJSON
	}
	nonce, ok := nonceString(body.Nonce)
	if !ok {
		return invalidForm("nonce", "BASE_TYPE_BAD_LENGTH", "Must be an integer or a string of at most 25 characters.")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.chanByID[r.PathValue("channel")]
	if ch == nil {
		return http.StatusNotFound, errUnknownChannel
	}
	if body.EnforceNonce && nonce != "" {
		if m := s.nonces[nonce]; m != nil && s.nowLocked().Sub(m.created) < NonceWindow {
			return http.StatusOK, s.messageWire(m, false, visibleAll)
		}
	}
	if strings.TrimSpace(discordStrip(body.Content)) == "" && len(body.Embeds) == 0 { // Discord strips and trims content
		return http.StatusBadRequest, apiError("Cannot send an empty message", 50006)
	}
	if utf8.RuneCountInString(body.Content) > maxContent {
		return invalidForm("content", "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length.")
	}
	var ref *message
	if mr := body.MessageReference; mr != nil {
		ref = s.messages[mr.MessageID]
		if ref == nil || (mr.ChannelID != "" && mr.ChannelID != ref.channelID) || ref.channelID != ch.ID {
			if mr.FailIfNotExists == nil || *mr.FailIfNotExists {
				return invalidForm("message_reference", "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message")
			}
			ref = nil
		}
	}
	created, id := s.tickLocked()
	m := &message{
		id:        id,
		channelID: ch.ID,
		guildID:   ch.GuildID,
		author:    s.bot,
		content:   discordStrip(body.Content),
		posted:    body.Content,
		embeds:    body.Embeds,
		flags:     body.Flags,
		typ:       discordgo.MessageTypeDefault,
		ref:       ref,
		nonce:     nonce,
		created:   created,
	}
	if ref != nil {
		m.typ = discordgo.MessageTypeReply
	}
	m.mentions, m.mentionEveryone, m.mentionRoles = s.mentionsLocked(m.content, body.AllowedMentions, ref)
	if nonce != "" {
		s.nonces[nonce] = m
	}
	s.storeLocked(m)
	s.dispatchMessageLocked("MESSAGE_CREATE", m)
	s.notifyLocked()
	return http.StatusOK, s.messageWire(m, false, visibleAll)
}

// nonceString turns a nonce (an integer or a string of at most 25 characters) into a
// string; ok is false for anything else.
func nonceString(raw json.RawMessage) (nonce string, ok bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", true
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return str, len(str) <= 25
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		if _, err := n.Int64(); err == nil {
			return n.String(), true
		}
	}
	return "", false
}

var mentionRE = regexp.MustCompile(`<@!?(\d+)>|<@&(\d+)>|@everyone|@here`)

// mentionsLocked works out whom a bot message pings, as Discord does: user mentions in the
// content, role mentions and @everyone/@here, filtered by allowed_mentions (absent:
// everything, and the replied-to author), plus the replied-to author if replied_user. Any
// role id counts as a role of the guild.
func (s *Server) mentionsLocked(content string, am *allowedMentions, ref *message) ([]User, bool, []string) {
	parseUsers, parseEveryone, parseRoles, replied := true, true, true, true
	var allowedUsers, allowedRoles []string
	if am != nil {
		parseUsers = slices.Contains(am.Parse, "users")
		parseEveryone = slices.Contains(am.Parse, "everyone")
		parseRoles = slices.Contains(am.Parse, "roles")
		replied = am.RepliedUser
		allowedUsers, allowedRoles = am.Users, am.Roles
	}
	var users []User
	var roles []string
	everyone := false
	for _, m := range mentionRE.FindAllStringSubmatch(content, -1) {
		if m[2] != "" {
			if (parseRoles || slices.Contains(allowedRoles, m[2])) && !slices.Contains(roles, m[2]) {
				roles = append(roles, m[2])
			}
			continue
		}
		if m[1] == "" {
			everyone = everyone || parseEveryone
			continue
		}
		u, known := s.users[m[1]]
		if known && (parseUsers || slices.Contains(allowedUsers, m[1])) {
			users = appendUser(users, u)
		}
	}
	if ref != nil && replied {
		users = appendUser(users, ref.author)
	}
	return users, everyone, roles
}

func (s *Server) editMessage(r *http.Request) (int, any) {
	var body struct {
		Content *string `json:"content"`
	}
	if !decodeBody(r, &body) {
		return http.StatusBadRequest, errInvalidJSON
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, status, errBody := s.botMessageLocked(r, apiError("Cannot edit a message authored by another user", 50005))
	if m == nil {
		return status, errBody
	}
	if body.Content != nil {
		if utf8.RuneCountInString(*body.Content) > maxContent {
			return invalidForm("content", "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length.")
		}
		if strings.TrimSpace(discordStrip(*body.Content)) == "" && len(m.embeds) == 0 {
			return http.StatusBadRequest, apiError("Cannot send an empty message", 50006)
		}
		m.content, m.posted = discordStrip(*body.Content), *body.Content
	}
	edited, _ := s.tickLocked()
	m.edited = &edited
	s.dispatchMessageLocked("MESSAGE_UPDATE", m)
	s.notifyLocked()
	return http.StatusOK, s.messageWire(m, false, visibleAll)
}

// botMessageLocked returns the message the request's path names, when it is in the path's
// channel and the bot wrote it; otherwise nil with the status and body Discord answers
// (forbidden: the body for a message of another author).
func (s *Server) botMessageLocked(r *http.Request, forbidden any) (*message, int, any) {
	ch := s.chanByID[r.PathValue("channel")]
	if ch == nil {
		return nil, http.StatusNotFound, errUnknownChannel
	}
	m := s.messages[r.PathValue("message")]
	if m == nil || m.channelID != ch.ID {
		return nil, http.StatusNotFound, errUnknownMessage
	}
	if m.author.ID != s.bot.ID {
		return nil, http.StatusForbidden, forbidden
	}
	return m, 0, nil
}

// deleteMessage deletes one of the bot's own messages (deleting other users' messages needs the
// Manage Messages permission, which the fake's bot does not have) and answers 204.
func (s *Server) deleteMessage(r *http.Request) (int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, status, errBody := s.botMessageLocked(r, apiError("Missing Permissions", 50013))
	if m == nil {
		return status, errBody
	}
	s.deleteLocked(m)
	s.deleted = append(s.deleted, m.id)
	return http.StatusNoContent, nil
}

func (s *Server) postTyping(r *http.Request) (int, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.chanByID[r.PathValue("channel")]
	if ch == nil {
		return http.StatusNotFound, errUnknownChannel
	}
	s.typing[ch.ID]++
	s.notifyLocked()
	return http.StatusNoContent, nil
}

func (s *Server) startThread(r *http.Request) (int, any) {
	var body struct {
		Name string `json:"name"`
	}
	if !decodeBody(r, &body) {
		return http.StatusBadRequest, errInvalidJSON
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.chanByID[r.PathValue("channel")]
	if ch == nil {
		return http.StatusNotFound, errUnknownChannel
	}
	m := s.messages[r.PathValue("message")]
	if m == nil || m.channelID != ch.ID {
		return http.StatusNotFound, errUnknownMessage
	}
	if ch.Type != discordgo.ChannelTypeGuildText && ch.Type != discordgo.ChannelTypeGuildNews {
		return http.StatusBadRequest, apiError("Cannot execute action on this channel type", 50024)
	}
	if s.chanByID[m.id] != nil {
		return http.StatusBadRequest, apiError("A thread has already been created for this message", 160004)
	}
	if n := utf8.RuneCountInString(body.Name); n < 1 || n > 100 {
		return invalidForm("name", "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
	}
	th := Channel{
		ID: m.id, GuildID: ch.GuildID, Type: discordgo.ChannelTypeGuildPublicThread,
		ParentID: ch.ID, OwnerID: s.bot.ID, Name: body.Name,
	}
	s.addChannelLocked(th)
	s.threads = append(s.threads, th)
	if s.sess != nil && s.sess.intents&discordgo.IntentsGuilds != 0 {
		w := s.channelWireLocked(&th)
		w["newly_created"] = true
		s.dispatchLocked("THREAD_CREATE", w)
	}
	s.notifyLocked()
	return http.StatusCreated, s.channelWireLocked(&th)
}
