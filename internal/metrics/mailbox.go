package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// MailboxDepths is agentgate_mailbox_depth{kind}: the messages queued in the mailboxes of every
// actor of a kind. protoactor's own mailbox gauge is never exported at the pinned version, so
// each kind's mailboxes share a Mailbox middleware that counts posts and receipts (Actor.Box).
type MailboxDepths struct {
	desc   *prometheus.Desc
	kinds  []string
	depths map[string]*Mailbox
}

func newMailboxDepths(kinds []string) *MailboxDepths {
	m := &MailboxDepths{
		desc:   prometheus.NewDesc("agentgate_mailbox_depth", "Messages queued in actor mailboxes, by actor kind.", []string{"kind"}, nil),
		kinds:  kinds,
		depths: map[string]*Mailbox{},
	}
	for _, k := range kinds {
		m.depths[k] = &Mailbox{}
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *MailboxDepths) Describe(ch chan<- *prometheus.Desc) { ch <- m.desc }

// Collect implements prometheus.Collector.
func (m *MailboxDepths) Collect(ch chan<- prometheus.Metric) {
	for _, k := range m.kinds {
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.GaugeValue, float64(m.depths[k].Depth()), k)
	}
}

// Mailbox counts the messages queued in the mailboxes that share it. It implements
// protoactor's actor.MailboxMiddleware; all methods are safe for concurrent use.
type Mailbox struct{ n atomic.Int64 }

// Depth is the number of messages posted and not yet received.
func (b *Mailbox) Depth() int64 { return b.n.Load() }

// Failed accounts for a message its actor is about to panic on: the mailbox never reports it
// received. (A panic elsewhere leaves the depth one too high.)
func (b *Mailbox) Failed() { b.n.Add(-1) }

// MailboxStarted implements actor.MailboxMiddleware.
func (b *Mailbox) MailboxStarted() {}

// MessagePosted implements actor.MailboxMiddleware.
func (b *Mailbox) MessagePosted(any) { b.n.Add(1) }

// MessageReceived implements actor.MailboxMiddleware.
func (b *Mailbox) MessageReceived(any) { b.n.Add(-1) }

// MailboxEmpty implements actor.MailboxMiddleware.
func (b *Mailbox) MailboxEmpty() {}
