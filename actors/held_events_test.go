package actors

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
	"github.com/asynkron/protoactor-go/actor"
)

// TestEventStreamSeesAReplyHeldBehindAWriteInFlight: the store refuses m1's turn result (a full
// disk) while m2's, its turn run meanwhile, is already on its way to the persistence actor, and
// would take m2's (room freed between two batches). A client that opens GET /events then, while
// m1's result is held, reads every reply of the key once, in seq order, once the store takes
// them. Before, the store took m2's result, and with it its outbox entry (seq 2), ahead of
// m1's: the client's replay read seq 2, and the stream skipped m1's reply (seq 1) when it came
// live, as one it had had; a reconnect with Last-Event-ID 2 skipped it again. The test runs in
// real time, not in a synctest bubble, whose clock stands still while a goroutine waits on a
// socket: the held result is tried again after a second.
func TestEventStreamSeesAReplyHeldBehindAWriteInFlight(t *testing.T) {
	const deadline = time.Minute
	agent, disk, release, _ := m1HeldM2InFlight()
	w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
		disk.Store = s
		return disk
	})
	sent, answered := make(chan struct{}), make(chan struct{})
	var sentOnce, answeredOnce sync.Once
	w.d.Persist = relayWrites(w.system, w.d.Persist, nil, func(wr *persistence.Write) {
		if slices.ContainsFunc(wr.Ops, resultOf("m2")) {
			sentOnce.Do(func() { close(sent) })
		}
	}, func(wr *persistence.Write, _ error) {
		if slices.ContainsFunc(wr.Ops, resultOf("m2")) {
			answeredOnce.Do(func() { close(answered) })
		}
	})
	base, shown := serveEvents(t, w)

	if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
		t.Fatalf("m1: %+v, want started", r)
	}
	if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Queued {
		t.Fatalf("m2: %+v, want queued", r)
	}
	close(release)
	await(t, sent, deadline, "m2's result reaches the persistence actor")
	close(disk.gate) // the store refuses m1's result
	await(t, answered, deadline, "m2's result is answered")
	stream := openEvents(t, base, w.key) // its replay is read from the store now
	disk.full.Store(false)               // room on the disk: m1's result is taken at its next try
	for _, want := range []int64{1, 2} {
		select {
		case seq := <-shown:
			if seq != want {
				t.Fatalf("the platform was sent seq %d, want %d", seq, want)
			}
		case <-time.After(deadline):
			t.Fatalf("the platform was not sent seq %d", want)
		}
	}
	w.request("m3", "three") // its reply, the stream's last event, shows the stream has seen the rest
	var got []string
	for ev := range stream.events(deadline) {
		got = append(got, ev)
		if strings.HasPrefix(ev, "3 ") {
			break
		}
	}
	if want := []string{"1 echo: one", "2 echo: two", "3 echo: three"}; !slices.Equal(got, want) {
		t.Errorf("the event stream showed %q, want %q", got, want)
	}
}

// fullWhile refuses every commit that holds a write pick picks, as a full disk does
// (persistence.ErrUnavailable for each group), while full is set; the first such commit waits
// for gate, and closes entered as it begins. It takes every other commit.
type fullWhile struct {
	persistence.Store
	pick    func(persistence.Op) bool
	entered chan struct{}
	gate    chan struct{}
	full    atomic.Bool
	first   sync.Once
}

func (d *fullWhile) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if !slices.ContainsFunc(groups, func(g []persistence.Op) bool { return slices.ContainsFunc(g, d.pick) }) {
		return d.Store.Commit(ctx, groups)
	}
	d.first.Do(func() {
		close(d.entered)
		<-d.gate
	})
	if !d.full.Load() {
		return d.Store.Commit(ctx, groups)
	}
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
	}
	return errs
}

// await waits until ch is closed, for at most within.
func await(t *testing.T, ch <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("waited %v in vain until %s", within, what)
	}
}

// relayWrites spawns an actor that stands between the sessions and the persistence actor
// persist: it passes each write on (calling sent once it has) and its answer back (calling
// answered first), and anything else on as it is. A write park picks (park may be nil) it keeps
// until it is sent a releaseParked, and passes on then. Stopped, it stops persist.
func relayWrites(system *actor.ActorSystem, persist *actor.PID, park func(*persistence.Write) bool,
	sent func(*persistence.Write), answered func(*persistence.Write, error)) *actor.PID {
	type pending struct {
		sender *actor.PID
		write  *persistence.Write
	}
	writes := map[uint64]pending{}
	var parked []*persistence.Write
	return system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *persistence.Write:
			writes[m.ID] = pending{c.Sender(), m}
			if park != nil && park(m) {
				parked = append(parked, m)
				return
			}
			c.Request(persist, m)
			sent(m)
		case releaseParked:
			for _, w := range parked {
				c.Request(persist, w)
				sent(w)
			}
			parked = nil
		case *persistence.WriteResult:
			if p, ok := writes[m.ID]; ok {
				delete(writes, m.ID)
				answered(p.write, m.Err)
				c.Send(p.sender, m)
			}
		case *actor.Stopping:
			_ = system.Root.StopFuture(persist).Wait()
		case actor.SystemMessage, actor.AutoReceiveMessage:
		default:
			c.Forward(persist)
		}
	}))
}

// releaseParked has relayWrites pass on the writes it keeps.
type releaseParked struct{}

// storeOutbox serves an event stream's replay from the world's store, as the daemon does; the
// test calls no other session route.
type storeOutbox struct {
	httpplatform.Sessions
	store persistence.Store
}

func (s storeOutbox) OutboxAfter(ctx context.Context, key string, after int64, limit int) ([]*platforms.Outbound, error) {
	es, err := s.store.OutboxAfter(ctx, key, after, limit)
	if err != nil {
		return nil, err
	}
	outs := make([]*platforms.Outbound, len(es))
	for i := range es {
		outs[i] = OutboundFromEntry(&es[i])
	}
	return outs, nil
}

func (s storeOutbox) LastOutboxSeq(ctx context.Context, key string) (int64, error) {
	return s.store.LastOutboxSeq(ctx, key)
}

// serveEvents runs the HTTP platform on 127.0.0.1 over w's store until the test ends, hands it
// every outbound the world's sessions send (w.sent), as the platform actor does, and returns
// its base URL and the seqs of the outbounds it was handed, in order.
func serveEvents(t *testing.T, w *managerWorld) (string, <-chan int64) {
	t.Helper()
	p, err := httpplatform.New(httpplatform.Config{Addr: "127.0.0.1:0", Sessions: storeOutbox{store: w.store}})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := p.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, func(context.Context, *platforms.Inbound) (*platforms.Ack, error) {
			return nil, fmt.Errorf("no messages in this test")
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("http platform: %v", err)
		}
	})
	shown := make(chan int64, cap(w.sent))
	go func() {
		for {
			select {
			case m := <-w.sent:
				_ = p.Send(ctx, m.Out)
				shown <- m.Out.Seq
			case <-ctx.Done():
				return
			}
		}
	}()
	return "http://" + addr.String(), shown
}

// eventStream is an open GET /events of a key.
type eventStream struct {
	t    *testing.T
	body *bufio.Reader
}

// openEvents opens the event stream of key and returns once its answer's header has come: the
// stream has read its replay from the store by then.
func openEvents(t *testing.T, base, key string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/sessions/"+url.PathEscape(key)+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /events: %s", resp.Status)
	}
	t.Cleanup(func() {
		cancel()
		resp.Body.Close()
	})
	return &eventStream{t: t, body: bufio.NewReader(resp.Body)}
}

// events yields each event of the stream as "id text" until within passes.
func (s *eventStream) events(within time.Duration) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		type event struct {
			text string
			err  error
		}
		ch := make(chan event, 1)
		var id string
		next := func() {
			for {
				line, err := s.body.ReadString('\n')
				if err != nil {
					ch <- event{err: err}
					return
				}
				line = strings.TrimSuffix(line, "\n")
				switch {
				case strings.HasPrefix(line, "id: "):
					id = strings.TrimPrefix(line, "id: ")
				case strings.HasPrefix(line, "data: "):
					var data httpplatform.Event
					if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &data); err != nil {
						ch <- event{err: err}
						return
					}
					ch <- event{text: id + " " + data.Text}
					return
				}
			}
		}
		stop := time.After(within)
		for {
			go next()
			select {
			case ev := <-ch:
				if ev.err != nil {
					s.t.Errorf("event stream: %v", ev.err)
					return
				}
				if !yield(ev.text) {
					return
				}
			case <-stop:
				s.t.Errorf("the event stream showed no event within %v", within)
				return
			}
		}
	}
}

// TestPersistRestartKeepsAWriteBehindAHeldResultBehindIt: as in
// TestResultInFlightBehindAHeldResultWaitsBehindIt, m2's result is on its way to the persistence
// actor when the store refuses m1's, but the persistence actor restarts before m2's result
// reaches it, and forgets the refusal; the new incarnation asks the session to send its
// unacknowledged writes again (persistence.ErrResend). The session does not send m2's result
// again to be taken ahead of m1's: it holds it behind m1's, and m1's reply goes out first, then
// m2's. Sent again, m2's result was taken, and its reply went out at once, ahead of m1's, its
// outbox entry in the store ahead of m1's.
func TestPersistRestartKeepsAWriteBehindAHeldResultBehindIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		agent, disk, release, ran := m1HeldM2InFlight()
		crash := &panicsOn{title: "crash"}
		w := newManagerWorldWrites(t, agent, nil, func(s persistence.Store) persistence.Store {
			disk.Store = s
			crash.Store = disk
			return crash
		})
		persist := w.d.Persist
		w.d.Persist = relayWrites(w.system, persist, func(wr *persistence.Write) bool {
			return wr.Incarnation == 0 && slices.ContainsFunc(wr.Ops, resultOf("m2"))
		}, func(*persistence.Write) {}, func(*persistence.Write, error) {})

		if r := w.deliver(t, "m1", "one"); r.Disposition != platforms.Started {
			t.Fatalf("m1: %+v, want started", r)
		}
		if r := w.deliver(t, "m2", "two"); r.Disposition != platforms.Queued {
			t.Fatalf("m2: %+v, want queued", r)
		}
		close(release)
		synctest.Wait() // m1's result waits in its commit; m2's waits in the relay
		close(disk.gate)
		synctest.Wait() // the store refused m1's result, and the session holds it
		w.system.Root.Send(persist, &persistence.Write{Ops: []persistence.Op{&persistence.SetTitle{SessionID: "none", Title: "crash"}}})
		synctest.Wait()
		if inc := w.d.PersistIncarnation.Load(); inc != 1 {
			t.Fatalf("the persistence actor's incarnation = %d, want 1: the test does not test", inc)
		}
		w.system.Root.Send(w.d.Persist, releaseParked{})
		synctest.Wait()
		disk.full.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()

		var sent []string
		for len(w.sent) > 0 {
			m := <-w.sent
			sent = append(sent, fmt.Sprint(m.Out.Seq, " ", m.Out.Text))
		}
		if want := []string{"1 echo: one", "2 echo: two"}; !slices.Equal(sent, want) {
			t.Errorf("sent %q, want %q", sent, want)
		}
		for _, id := range []string{"m1", "m2"} {
			if n := ran(id); n != 1 {
				t.Errorf("the agent ran %s %d times, want once", id, n)
			}
		}
	})
}

// panicsOn is a store whose commit panics when it holds a SetTitle to title (the persistence
// actor restarts).
type panicsOn struct {
	persistence.Store
	title string
}

func (p *panicsOn) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	for _, g := range groups {
		for _, op := range g {
			if st, ok := op.(*persistence.SetTitle); ok && st.Title == p.title {
				panic("commit (test)")
			}
		}
	}
	return p.Store.Commit(ctx, groups)
}

// m1HeldM2InFlight is the agent and the disk of the tests in which the store refuses m1's turn
// result (the disk full for it alone) while m2's, its turn run meanwhile, is on its way: m1's
// turn waits for release, so that m2 is stored and queued behind it, and m2's until m1's result
// is in its commit. ran counts each message's runs.
func m1HeldM2InFlight() (agent agents.Agent, disk *fullWhile, release chan struct{}, ran func(id string) int) {
	echo, ran := countingEcho()
	disk = &fullWhile{pick: resultOf("m1"), entered: make(chan struct{}), gate: make(chan struct{})}
	disk.full.Store(true)
	release = make(chan struct{})
	agent = agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
		switch req.Identity.MessageID {
		case "m1":
			<-release // m2 is stored and queued behind it
		case "m2":
			<-disk.entered // m1's result is in its commit, alone
		}
		return echo.Run(ctx, req)
	})
	return agent, disk, release, ran
}
