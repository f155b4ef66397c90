package persistence_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/persistence/workload"
)

// BenchmarkPipeline measures what protoactor costs end to end (issue #9: the protoactor
// pipeline reaches at least 0.85× the throughput of the same pipeline on plain channels, in one
// run; perf-anchors §8 G8). Both pipelines have the same four stages and the same messages:
//
//	intake (one client goroutine per session, closed loop) → session → persistence (group
//	commit) → session → reply → intake
//
// In "proto" the session, persistence and reply stages are actors: one session actor per
// session, the real persistence.Actor, and one reply actor, as in the daemon. In "chan" they are
// goroutines that talk over channels: one per session, one committer with the same pacing as
// persistence.Actor (commit everything queued, then wait up to 1/8 of the last commit for the
// writers just answered), one reply goroutine. store=sqlite commits the workload's turns to a
// fresh SQLite file (synchronous FULL); that is the figure the target is about. store=stub
// answers every Commit at once, which leaves only the messaging and shows the framework's own
// cost per turn. Each round runs both pipelines, order alternating, and reports per-round
// ratios; the metrics are medians over rounds.
func BenchmarkPipeline(b *testing.B) {
	for _, tc := range []struct {
		store         string
		sessions, per int
	}{
		{"sqlite", 100, 50},
		{"sqlite", 1000, 5},
		{"stub", 100, 1000},
		{"stub", 1000, 100},
	} {
		b.Run(fmt.Sprintf("store=%s/sessions=%d", tc.store, tc.sessions), func(b *testing.B) {
			w := newWorkload(tc.sessions, tc.per)
			var proto, chans, ratio []float64
			round := 0
			for b.Loop() {
				b.StopTimer()
				var p, c time.Duration
				if round%2 == 0 {
					p, c = runPipeline(b, w, tc.store, pipeProto), runPipeline(b, w, tc.store, pipeChan)
				} else {
					c, p = runPipeline(b, w, tc.store, pipeChan), runPipeline(b, w, tc.store, pipeProto)
				}
				round++
				pr, cr := float64(w.total)/p.Seconds(), float64(w.total)/c.Seconds()
				proto, chans, ratio = append(proto, pr), append(chans, cr), append(ratio, pr/cr)
				if testing.Verbose() {
					b.Logf("round %d: proto %.0f turns/s, chan %.0f turns/s, ratio %.3f", round, pr, cr, pr/cr)
				}
				b.StartTimer()
			}
			b.ReportMetric(workload.Median(proto), "proto_turns/s")
			b.ReportMetric(workload.Median(chans), "chan_turns/s")
			b.ReportMetric(workload.Median(ratio), "ratio")
			b.ReportMetric((1/workload.Median(proto)-1/workload.Median(chans))*1e6, "added_us/turn")
			if tc.store == "sqlite" { // the stub measures the frameworks alone, with no target
				b.Log(workload.Target{Name: fmt.Sprintf("G8 protoactor ÷ channels at %d sessions", tc.sessions), Bound: 0.85}.Verdict(workload.Median(ratio)))
			}
		})
	}
}

type pipeKind int

const (
	pipeProto pipeKind = iota
	pipeChan
)

// stubStore answers every Commit at once: only the pipeline's messaging remains.
type stubStore struct{ persistence.Store }

func (stubStore) Commit(_ context.Context, groups [][]persistence.Op) []error {
	return make([]error, len(groups))
}

// runPipeline runs the load through one pipeline on a fresh store and returns how long it took
// from the first message to the last reply.
func runPipeline(b *testing.B, w *load, storeKind string, kind pipeKind) time.Duration {
	b.Helper()
	var store persistence.Store = stubStore{}
	if storeKind == "sqlite" {
		s, closeStore := mustOpenStore(b, w)
		defer closeStore()
		store = s
	}
	var p pipeline
	if kind == pipeProto {
		p = startProtoPipeline(store, w)
	} else {
		p = startChanPipeline(store, w)
	}
	defer p.stop()
	runtime.GC()

	errs := make([]error, len(w.sessions))
	var wg sync.WaitGroup
	b.StartTimer()
	start := time.Now()
	for i := range w.sessions {
		wg.Go(func() {
			replies := make(chan pipeReply, 1)
			for k := range w.turns[i] {
				p.deliver(i, &pipeMsg{session: i, turn: k, replies: replies})
				if r := <-replies; r.err != nil || r.turn != k {
					errs[i] = fmt.Errorf("session %d turn %d: reply for turn %d: %v", i, k, r.turn, r.err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return elapsed
}

// pipeMsg is one inbound message of a session; its reply goes to replies.
type pipeMsg struct {
	session, turn int
	replies       chan<- pipeReply
}

// pipeReply is what the reply stage hands back to intake.
type pipeReply struct {
	turn int
	err  error
}

type pipeline interface {
	deliver(session int, m *pipeMsg)
	stop()
}

// The protoactor pipeline.

type protoPipeline struct {
	system   *actor.ActorSystem
	persist  *actor.PID
	reply    *actor.PID
	sessions []*actor.PID
}

func startProtoPipeline(store persistence.Store, w *load) *protoPipeline {
	p := &protoPipeline{system: actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))}
	p.persist = p.system.Root.Spawn(actor.PropsFromProducer(persistence.NewActor(context.Background(), store,
		persistence.ActorOptions{MaxBatch: benchMaxBatch})))
	p.reply = p.system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*protoReply); ok {
			m.to <- m.reply
		}
	}))
	for i := range w.sessions {
		turns := w.turns[i]
		p.sessions = append(p.sessions, p.system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
			return &protoSession{persist: p.persist, reply: p.reply, turns: turns}
		})))
	}
	return p
}

func (p *protoPipeline) deliver(session int, m *pipeMsg) { p.system.Root.Send(p.sessions[session], m) }

func (p *protoPipeline) stop() {
	for _, pid := range append(p.sessions, p.reply, p.persist) {
		_ = p.system.Root.PoisonFuture(pid).Wait()
	}
	p.system.Shutdown()
}

// protoReply asks the reply actor to hand a reply to intake.
type protoReply struct {
	to    chan<- pipeReply
	reply pipeReply
}

// protoSession is the session stage: it writes the turn, and replies once it is durable.
type protoSession struct {
	persist, reply *actor.PID
	turns          [][]persistence.Op
	waiting        map[uint64]*pipeMsg
}

func (s *protoSession) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		s.waiting = map[uint64]*pipeMsg{}
	case *pipeMsg:
		id := uint64(m.turn + 1)
		s.waiting[id] = m
		c.Request(s.persist, &persistence.Write{ID: id, Ops: s.turns[m.turn]})
	case *persistence.WriteResult:
		in := s.waiting[m.ID]
		delete(s.waiting, m.ID)
		c.Send(s.reply, &protoReply{to: in.replies, reply: pipeReply{turn: in.turn, err: m.Err}})
	}
}

// The same pipeline on goroutines and channels.

type chanPipeline struct {
	sessions []chan *pipeMsg
	writes   chan *chanWrite
	replies  chan protoReply
	sessWG   sync.WaitGroup // the session goroutines
	wg       sync.WaitGroup // the committer and the reply goroutine
}

// chanWrite is a Write with the channel its result goes to and the time it was sent.
type chanWrite struct {
	id     uint64
	ops    []persistence.Op
	at     time.Time
	result chan<- *persistence.WriteResult
}

func startChanPipeline(store persistence.Store, w *load) *chanPipeline {
	p := &chanPipeline{writes: make(chan *chanWrite, len(w.sessions)), replies: make(chan protoReply, len(w.sessions))}
	p.wg.Go(func() { chanCommitter(store, p.writes) })
	p.wg.Go(func() {
		for r := range p.replies {
			r.to <- r.reply
		}
	})
	for i := range w.sessions {
		in := make(chan *pipeMsg, 1)
		p.sessions = append(p.sessions, in)
		turns := w.turns[i]
		p.sessWG.Go(func() {
			results := make(chan *persistence.WriteResult, 1)
			for m := range in {
				p.writes <- &chanWrite{id: uint64(m.turn + 1), ops: turns[m.turn], at: time.Now(), result: results}
				r := <-results
				p.replies <- protoReply{to: m.replies, reply: pipeReply{turn: m.turn, err: r.Err}}
			}
		})
	}
	return p
}

func (p *chanPipeline) deliver(session int, m *pipeMsg) { p.sessions[session] <- m }

func (p *chanPipeline) stop() {
	for _, in := range p.sessions {
		close(in)
	}
	p.sessWG.Wait()
	close(p.writes)
	close(p.replies)
	p.wg.Wait()
}

// chanCommitter is the persistence stage on channels, paced like persistence.Actor: it commits
// what is queued (at most benchMaxBatch) and answers; the next batch then waits until as many
// writes were sent after the answers as were answered, for at most 1/8 of the last commit's
// duration (not at all below 100 µs, at most 2 ms).
func chanCommitter(store persistence.Store, writes <-chan *chanWrite) {
	ctx := context.Background()
	var batch []*chanWrite
	var answeredAt time.Time
	answered, last := 0, time.Duration(0)
	open := true
	for open || len(batch) > 0 {
		if len(batch) == 0 {
			w, ok := <-writes
			if !ok {
				return
			}
			batch = append(batch, w)
		}
		linger := min(last/8, persistence.DefaultMaxLinger)
		if linger < 100*time.Microsecond {
			linger = 0
		}
		deadline := answeredAt.Add(linger)
		arrived := func() int {
			n := 0
			for _, w := range batch {
				if !w.at.Before(answeredAt) {
					n++
				}
			}
			return n
		}
	gather:
		for open && len(batch) < benchMaxBatch {
			select {
			case w, ok := <-writes:
				if !ok {
					open = false
					break gather
				}
				batch = append(batch, w)
				continue
			default:
			}
			wait := time.Until(deadline)
			if wait <= 0 || arrived() >= answered {
				break
			}
			t := time.NewTimer(wait)
			select {
			case w, ok := <-writes:
				t.Stop()
				if !ok {
					open = false
					break gather
				}
				batch = append(batch, w)
			case <-t.C:
				break gather
			}
		}
		n := min(len(batch), benchMaxBatch)
		groups := make([][]persistence.Op, n)
		for i, w := range batch[:n] {
			groups[i] = w.ops
		}
		start := time.Now()
		errs := store.Commit(ctx, groups)
		last = time.Since(start)
		answeredAt = time.Now()
		for i, w := range batch[:n] {
			w.result <- &persistence.WriteResult{ID: w.id, Err: errs[i]}
		}
		answered = n
		batch = append(batch[:0], batch[n:]...)
	}
}
