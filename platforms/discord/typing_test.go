package discord

import (
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/platforms"
)

// The typing indicator runs while a channel's turns work, and stops with the reply that ends
// the last one, whatever the order of a turn's end and its delivery's acknowledgment.
func TestTypingFollowsTurns(t *testing.T) {
	ack := func(disposition string) *platforms.Ack { return &platforms.Ack{Disposition: disposition} }
	tests := []struct {
		name  string
		steps func(tp *typing)
		want  int // indicators sent over the first typingEvery and three renewals
	}{
		{"a turn shows the indicator until its reply", func(tp *typing) {
			tp.expect("c", "m1")
			tp.delivered("c", "m1", ack(platforms.Started), nil)
			synctest.Wait()
			time.Sleep(typingEvery + time.Second) // one renewal
			tp.turnEnded("c", []string{"m1"})
		}, 2},
		{"a turn that ended before its acknowledgment shows none", func(tp *typing) {
			tp.expect("c", "m1")
			tp.turnEnded("c", []string{"m1"}) // a fast agent: the reply is out first
			tp.delivered("c", "m1", ack(platforms.Started), nil)
		}, 0},
		{"a message that starts no turn shows none", func(tp *typing) {
			tp.expect("c", "m1")
			tp.delivered("c", "m1", ack(platforms.Duplicate), nil)
		}, 0},
		{"a duplicate of a message whose turn works leaves the indicator to its reply", func(tp *typing) {
			tp.expect("c", "m1")
			tp.delivered("c", "m1", ack(platforms.Started), nil)
			tp.expect("c", "m1") // handed on again: held during a backfill that read it back
			tp.delivered("c", "m1", ack(platforms.Duplicate), nil)
			synctest.Wait()
			time.Sleep(typingEvery + time.Second) // one renewal
			tp.turnEnded("c", []string{"m1"})
		}, 2},
		{"a refused message shows none", func(tp *typing) {
			tp.expect("c", "m1")
			tp.delivered("c", "m1", nil, errors.New("unavailable"))
		}, 0},
		{"two turns: the indicator runs until the second reply", func(tp *typing) {
			tp.expect("c", "m1")
			tp.delivered("c", "m1", ack(platforms.Started), nil)
			tp.expect("c", "m2")
			tp.delivered("c", "m2", ack(platforms.Queued), nil)
			synctest.Wait()
			tp.turnEnded("c", []string{"m1"})
			time.Sleep(typingEvery + time.Second) // still one turn to come: renewed
			tp.turnEnded("c", []string{"m2"})
		}, 2},
		{"a command's answer settles the messages it dropped", func(tp *typing) {
			for _, id := range []string{"m1", "m2"} { // running, queued
				tp.expect("c", id)
				tp.delivered("c", id, ack(platforms.Queued), nil)
			}
			tp.expect("c", "stop")
			tp.delivered("c", "stop", ack(platforms.Command), nil)
			synctest.Wait()
			tp.turnEnded("c", []string{"m1", "m2", "stop"})
		}, 1},
		{"a collected message settles with its turn's reply", func(tp *typing) {
			tp.expect("c", "m1")
			tp.delivered("c", "m1", ack(platforms.Started), nil)
			tp.expect("c", "m2")
			tp.delivered("c", "m2", ack(platforms.Collected), nil)
			synctest.Wait()
			tp.turnEnded("c", []string{"m1", "m2"})
		}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var sent atomic.Int32
				tp := newTyping(func(string) { sent.Add(1) })
				tt.steps(tp)
				synctest.Wait()
				time.Sleep(3 * typingEvery) // an indicator left running would be renewed
				synctest.Wait()
				if n := int(sent.Load()); n != tt.want {
					t.Errorf("%d indicators sent, want %d", n, tt.want)
				}
				tp.mu.Lock()
				left := len(tp.chans)
				tp.mu.Unlock()
				if left != 0 {
					t.Errorf("%d channels still counted, want none", left)
				}
				tp.stopAll()
			})
		})
	}
}
