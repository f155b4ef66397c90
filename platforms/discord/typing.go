package discord

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/internal/logging"
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
// that starts or queues a turn is awaited, and a reply that ends a turn settles the messages it
// answers (a command's answer also answers the messages it dropped; a turn after an interrupt
// also the interrupted one), and so does the withdrawal of a deleted one (deleted.go), which no
// reply answers. The indicator stops when none is awaited.
//
// A message is awaited before it is delivered (expect) and settled once its delivery is
// acknowledged (delivered): a fast turn's reply can end the turn before its acknowledgment
// comes back, and a message awaited only then would never be settled (the indicator ran on
// until typingMax, long after the reply). The indicator starts at the acknowledgment, so a
// message that starts no turn shows none.
type typing struct {
	send func(channel string)

	mu    sync.Mutex
	chans map[string]*typist
}

type typist struct {
	where string // the channel the indicator shows in (set once: read by run)
	// awaited are the message ids whose turn is to come or runs, each with the deliveries of
	// it not yet acknowledged, and one for its turn once one acknowledged it: a message handed
	// on twice (held during a backfill and read back by it) is acknowledged once as a duplicate,
	// which settled the message and stopped the indicator while its turn worked.
	awaited map[string]int
	since   time.Time
	cancel  context.CancelFunc // of the indicator's goroutine; nil before it starts
}

func newTyping(send func(channel string)) *typing {
	return &typing{send: send, chans: map[string]*typist{}}
}

// expect awaits message id, about to be delivered in channel, as a turn to come.
func (t *typing) expect(channel, id string) { t.expectIn(channel, channel, id) }

// expectIn is expect with the indicator shown in where, if it is not running yet: the channel
// an auto-thread not opened yet (channel) is to open from, where its user waits.
func (t *typing) expectIn(channel, where, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp := t.chans[channel]
	if tp == nil {
		tp = &typist{where: where, awaited: map[string]int{}}
		t.chans[channel] = tp
	}
	tp.awaited[id]++
	tp.since = time.Now()
}

// delivered settles an expect with the delivery's outcome: a message that starts or queues no
// turn is taken away again; one that does starts the indicator, unless every turn counted has
// ended already.
func (t *typing) delivered(channel, id string, ack *platforms.Ack, err error) {
	counted := false
	if err == nil && ack != nil {
		switch ack.Disposition {
		case platforms.Started, platforms.Queued, platforms.Spooled, platforms.Command:
			counted = true
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tp := t.chans[channel]
	switch {
	case tp == nil:
		// every turn counted has ended
	case !counted:
		// Merged into a counted turn, replaced one, or no turn at all; or a duplicate of a
		// delivery that counted: that one's turn still works.
		if tp.awaited[id]--; tp.awaited[id] <= 0 {
			t.settleLocked(channel, tp, id)
		}
	case tp.cancel == nil:
		ctx, cancel := context.WithCancel(context.Background())
		tp.cancel = cancel
		go t.run(ctx, channel, tp)
	}
}

// turnEnded settles the messages a reply that ended a turn in channel answers.
func (t *typing) turnEnded(channel string, answered []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tp := t.chans[channel]
	for _, id := range answered {
		if tp != nil {
			t.settleLocked(channel, tp, id)
		}
		tp = t.chans[channel]
	}
}

func (t *typing) settleLocked(channel string, tp *typist, id string) {
	if delete(tp.awaited, id); len(tp.awaited) == 0 {
		if tp.cancel != nil {
			tp.cancel()
		}
		delete(t.chans, channel)
	}
}

func (t *typing) stopAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for ch, tp := range t.chans {
		if tp.cancel != nil {
			tp.cancel()
		}
		delete(t.chans, ch)
	}
}

func (t *typing) run(ctx context.Context, channel string, tp *typist) {
	tick := time.NewTicker(typingEvery)
	defer tick.Stop()
	for {
		t.send(tp.where)
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
	ep := discordgo.EndpointChannelTyping(channel)
	if err := p.request(ctx, http.MethodPost, ep, ep, nil, nil); err != nil {
		p.log.Debug("discord typing indicator", "channel", channel, logging.Err(err))
	}
}
