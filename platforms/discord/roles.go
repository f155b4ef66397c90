package discord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/logging"
)

// The bot's role. Discord makes a role for a bot in each guild it joins (managed, with
// tags.bot_id the bot's user id), named after it: a user who types @ and the bot's name is
// offered both, and often picks the role. A mention of that role (<@&ROLE>) is a mention of the
// bot; before, it counted as none, and in a channel where the bot answers only when mentioned
// the message was ignored without a word. Any other role's mention is none.
//
// discordgo's Role has no tags, so the platform reads them from the raw GUILD_CREATE (and
// GUILD_UPDATE, GUILD_ROLE_CREATE, GUILD_ROLE_UPDATE and GUILD_ROLE_DELETE) and keeps the bot's
// role of each guild (roles). A message that mentions a role in a guild whose GUILD_CREATE has
// not come yet (a backfill runs beside the gateway's first events, and Discord sends a large
// bot's guilds over seconds) looks the guild's roles up over REST (Get Guild Roles).

// wireRole is what the platform reads of a role object.
type wireRole struct {
	ID   string `json:"id"`
	Tags *struct {
		BotID string `json:"bot_id"`
	} `json:"tags"`
}

// botRoleIn returns the id of bot's managed role among roles, or "".
func botRoleIn(roles []wireRole, bot string) string {
	for _, r := range roles {
		if bot != "" && r.Tags != nil && r.Tags.BotID == bot {
			return r.ID
		}
	}
	return ""
}

// onEvent reads the bot's role of a guild from the raw events that carry roles.
func (p *Platform) onEvent(_ *discordgo.Session, e *discordgo.Event) {
	bot := p.bot()
	if bot == "" {
		return // READY, which names the bot, comes first
	}
	switch e.Type {
	case "GUILD_CREATE", "GUILD_UPDATE":
		var g struct {
			ID          string     `json:"id"`
			Unavailable bool       `json:"unavailable"`
			Roles       []wireRole `json:"roles"`
		}
		if json.Unmarshal(e.RawData, &g) != nil || g.ID == "" || g.Unavailable {
			return
		}
		p.setBotRole(g.ID, botRoleIn(g.Roles, bot))
	case "GUILD_ROLE_CREATE", "GUILD_ROLE_UPDATE":
		var r struct {
			GuildID string   `json:"guild_id"`
			Role    wireRole `json:"role"`
		}
		if json.Unmarshal(e.RawData, &r) != nil || botRoleIn([]wireRole{r.Role}, bot) == "" {
			return
		}
		p.setBotRole(r.GuildID, r.Role.ID)
	case "GUILD_ROLE_DELETE":
		var d struct {
			GuildID string `json:"guild_id"`
			RoleID  string `json:"role_id"`
		}
		if json.Unmarshal(e.RawData, &d) != nil {
			return
		}
		p.mu.Lock()
		if r, ok := p.roles[d.GuildID]; ok && r == d.RoleID {
			p.roles[d.GuildID] = ""
		}
		p.mu.Unlock()
	case "GUILD_DELETE":
		var g struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(e.RawData, &g) == nil {
			p.mu.Lock()
			delete(p.roles, g.ID) // left, or an outage: the next GUILD_CREATE says again
			p.mu.Unlock()
		}
	}
}

func (p *Platform) setBotRole(guild, role string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.roles[guild] = role
}

// mentionsARole reports whether m may mention a role.
func mentionsARole(m *discordgo.Message) bool {
	return m.GuildID != "" && (len(m.MentionRoles) > 0 || strings.Contains(m.Content, "<@&"))
}

// botRole returns the id of the bot's role in m's guild if m mentions a role, else "" (no
// lookup is needed). A lookup that fails is logged and counts as no role: the message is
// handled as one that mentions another role. One that ctx cut short (the daemon's stop, or its
// notice bound: noticeCtx; also a rate limit past that bound, cutShort) returns its error
// instead, and is neither logged nor remembered as a miss: the role is not known, and the caller leaves the message for the next start
// (handle). Counted as none, a mention of the bot's role in a chat where the bot answers only
// when mentioned was dropped as one not for the bot, and not read back; remembered as a miss,
// it made every later message of the stop that mentions a role in that guild count none
// without a lookup, and those of a run again within roleRetry (a cluster member's).
func (p *Platform) botRole(ctx context.Context, m *discordgo.Message) (string, error) {
	if !mentionsARole(m) {
		return "", nil
	}
	p.mu.Lock()
	role, ok := p.roles[m.GuildID]
	failed := p.roleMisses[m.GuildID]
	p.mu.Unlock()
	if ok || time.Since(failed) < roleRetry {
		return role, nil
	}
	lookup, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	ep := discordgo.EndpointGuildRoles(m.GuildID)
	var roles []wireRole
	if err := p.request(lookup, http.MethodGet, ep, ep, nil, &roles); err != nil {
		if cutShort(ctx, lookup, err) {
			return "", fmt.Errorf("look up the roles of guild %s: %w", m.GuildID, err)
		}
		p.log.Warn("discord: cannot look up the guild's roles; a mention of the bot's role is not seen as a mention",
			"guild", m.GuildID, "message_id", m.ID, logging.Err(err))
		// Not asked again for a while: each lookup holds the gateway's reader, and in an
		// outage or a rate limit every message that mentions a role would (a review's finding).
		p.mu.Lock()
		p.roleMisses[m.GuildID] = time.Now()
		p.mu.Unlock()
		return "", nil
	}
	role = botRoleIn(roles, p.bot())
	p.setBotRole(m.GuildID, role)
	return role, nil
}

// cutShort reports whether err, of a REST call made on lookup (ctx bounded by restTimeout),
// is ctx's doing, not Discord's: ctx ended, or the call was not sent because a rate limit
// lasts past ctx's deadline, which bounds lookup (the stop's notice bound, noticeCtx: 3 s).
// Taken for Discord's failure, a role lookup the stop's bound refused that way at once (a
// guild's roles rate limited for a few seconds) was remembered as a miss, and its message,
// a mention of the bot's role, dropped as one not for the bot and not read back.
func cutShort(ctx, lookup context.Context, err error) bool {
	if restStatus(err) != 0 {
		return false
	}
	if ctx.Err() != nil {
		return true
	}
	_, unsent := errors.AsType[*notSent](err)
	bound, ok := ctx.Deadline()
	end, _ := lookup.Deadline()
	return unsent && ok && !bound.After(end)
}

// roleRetry is how long after a failed lookup of a guild's roles none is made again.
const roleRetry = time.Minute

// mentionsRole reports whether m mentions role (the bot's).
func mentionsRole(m *discordgo.Message, role string) bool {
	return role != "" && (slices.Contains(m.MentionRoles, role) || strings.Contains(m.Content, "<@&"+role+">"))
}
