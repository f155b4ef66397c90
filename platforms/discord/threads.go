package discord

import (
	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/logging"
)

// Threads in discordgo's state. The state keeps every thread it is told of (THREAD_CREATE for
// every thread opened in the bot's guilds, one per auto-threaded mention, and the active threads
// of every GUILD_CREATE) until THREAD_DELETE, which archiving does not send, and a GUILD_CREATE
// after a new gateway session adds the active threads without removing those archived
// meanwhile: over months it would hold every thread ever opened. The platform forgets a thread
// when it is archived, and at each GUILD_CREATE every thread of the guild the state still holds
// but the guild no longer lists as active; live mirrors the threads the state holds, since the
// state cannot list them. A message in an archived thread (which unarchives it) is looked up over
// REST (channelCache), and its THREAD_UPDATE puts the thread back.

func (p *Platform) onThreadCreate(_ *discordgo.Session, c *discordgo.ThreadCreate) {
	p.noteThread(c.Channel)
}

func (p *Platform) onThreadUpdate(_ *discordgo.Session, u *discordgo.ThreadUpdate) {
	p.noteThread(u.Channel)
}

func (p *Platform) onThreadDelete(_ *discordgo.Session, d *discordgo.ThreadDelete) {
	if d.Channel != nil {
		p.mu.Lock()
		delete(p.live, d.ID)
		p.mu.Unlock()
		p.markOpened(d.ID)
	}
}

// markOpened records that the thread id was open, with auto-thread on: a reply to it that
// Discord answers 404 is one to a thread deleted (a moderator's act, heard of or not), which is
// not opened again from its starter message (unopenedThread). Only where this process opened
// or posted in an auto-thread, or heard of a thread's deletion: not every thread of the guilds,
// which the gateway tells of too.
func (p *Platform) markOpened(id string) {
	if !p.cfg.AutoThread {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opened[id] {
		return
	}
	if len(p.opened) >= maxProgress {
		clear(p.opened) // a thread forgotten so is taken for one whose opening failed
	}
	p.opened[id] = true
}

// onThreadListSync drops from live the threads the state dropped (the sync replaces the
// threads of the channels it names).
func (p *Platform) onThreadListSync(_ *discordgo.Session, s *discordgo.ThreadListSync) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, g := range p.live {
		if g != s.GuildID {
			continue
		}
		if _, err := p.s.State.Channel(id); err != nil {
			delete(p.live, id)
		}
	}
	for _, t := range s.Threads {
		p.noteThreadLocked(t)
	}
}

// onGuildCreate forgets the threads of the guild that are no longer active: those archived
// while the bot was not connected.
func (p *Platform) onGuildCreate(_ *discordgo.Session, c *discordgo.GuildCreate) {
	if c.Guild == nil || c.Threads == nil {
		return
	}
	active := make(map[string]bool, len(c.Threads))
	for _, t := range c.Threads {
		active[t.ID] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, g := range p.live {
		if g == c.ID && !active[id] {
			p.forgetThreadLocked(id, g)
		}
	}
	for _, t := range c.Threads {
		p.noteThreadLocked(t)
	}
}

// noteThread records a thread the state now holds, or forgets it when it is archived.
func (p *Platform) noteThread(t *discordgo.Channel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noteThreadLocked(t)
}

func (p *Platform) noteThreadLocked(t *discordgo.Channel) {
	if t == nil || !t.IsThread() {
		return
	}
	if t.ThreadMetadata != nil && t.ThreadMetadata.Archived {
		p.forgetThreadLocked(t.ID, t.GuildID)
		return
	}
	p.live[t.ID] = t.GuildID
}

func (p *Platform) forgetThreadLocked(id, guild string) {
	delete(p.live, id)
	// ChannelRemove finds a thread by its id, guild and type alone.
	err := p.s.State.ChannelRemove(&discordgo.Channel{ID: id, GuildID: guild, Type: discordgo.ChannelTypeGuildPublicThread})
	if err != nil && err != discordgo.ErrStateNotFound {
		p.log.Debug("discord: forget a thread", "thread", id, logging.Err(err))
	}
}
