package discord

import (
	"context"
	"sync"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/platforms"
)

const (
	// typingEvery renews the indicator, which Discord shows for about 10 seconds.
	typingEvery = 8 * time.Second
	// typingMax stops an indicator whose turn never reported its end (an interrupted turn's
	// stale reply is never sent, say).
	typingMax = 15 * time.Minute
)

// typing runs Discord's typing indicator in a channel while turns for it work: each message
// that starts or queues a turn adds one, each reply that ends a turn takes one away.
type typing struct {
	send func(channel string)

	mu    sync.Mutex
	chans map[string]*typist
}

type typist struct {
	turns  int
	since  time.Time
	cancel context.CancelFunc
}

func newTyping(send func(channel string)) *typing {
	return &typing{send: send, chans: map[string]*typist{}}
}

// turnFor counts a delivered message's disposition: one more turn to come for channel, or not.
func (t *typing) turnFor(channel, disposition string) {
	switch disposition {
	case platforms.Started, platforms.Queued, platforms.Spooled, platforms.Command:
	default: // merged into a turn that is already counted, replaced it, or no turn at all
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tp := t.chans[channel]
	if tp == nil {
		ctx, cancel := context.WithCancel(context.Background())
		tp = &typist{cancel: cancel}
		t.chans[channel] = tp
		go t.run(ctx, channel, tp)
	}
	tp.turns++
	tp.since = time.Now()
}

// turnEnded counts a reply that ended a turn in channel.
func (t *typing) turnEnded(channel string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp := t.chans[channel]
	if tp == nil {
		return
	}
	if tp.turns--; tp.turns <= 0 {
		tp.cancel()
		delete(t.chans, channel)
	}
}

func (t *typing) stopAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for ch, tp := range t.chans {
		tp.cancel()
		delete(t.chans, ch)
	}
}

func (t *typing) run(ctx context.Context, channel string, tp *typist) {
	tick := time.NewTicker(typingEvery)
	defer tick.Stop()
	for {
		t.send(channel)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		stale := t.chans[channel] == tp && time.Since(tp.since) > typingMax
		if stale {
			tp.cancel()
			delete(t.chans, channel)
		}
		t.mu.Unlock()
		if stale {
			return
		}
	}
}

func (p *Platform) sendTyping(channel string) {
	p.mu.Lock()
	ctx := p.runCtx
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, restTimeout)
	defer cancel()
	if err := p.s.ChannelTyping(channel, discordgo.WithContext(ctx)); err != nil {
		p.log.Debug("discord typing indicator", "channel", channel, "err", err)
	}
}
