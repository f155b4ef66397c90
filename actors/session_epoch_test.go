package actors

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentgate/agentgate/agents/echo"
)

// TestSessionRecordsTheEpochItBeganUnder: a session's row keeps the epoch of the key's claim
// under which it began (persistence.Session.Epoch, shown by agentgate sessions show), in
// cluster mode; a later activation, which claims a newer epoch, begins its sessions under
// that one and leaves the earlier ones as they are. A single daemon claims nothing: 0. Before,
// nothing set it, and every session showed 0.
func TestSessionRecordsTheEpochItBeganUnder(t *testing.T) {
	for _, tt := range []struct {
		name    string
		cluster bool
		want    [2]int64 // the epochs of the key's first and second sessions
	}{
		// Two claims by another member come first: the first activation claims 3, the next 4.
		{"cluster member", true, [2]int64{3, 4}},
		{"single daemon", false, [2]int64{0, 0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newManagerWorld(t, echo.New(), func(d *Deps) {
					if tt.cluster {
						d.Node, d.Fencing, d.Clustered = "a", true, true
					}
				})
				if tt.cluster {
					for range 2 {
						if _, err := w.store.Claim(w.ctx, w.key, "b", time.Now(), nil); err != nil {
							t.Fatal(err)
						}
					}
				}
				m1 := w.deliver(t, "m1", "hello")
				w.awaitTurnEnds(1)
				time.Sleep(2 * time.Hour) // the session passivates: the next message activates the key again
				synctest.Wait()
				n1, _ := w.command(t, "n1", "/new")
				if n1.SessionId == m1.SessionId {
					t.Fatalf("/new kept session %s, want a new one", n1.SessionId)
				}
				for i, sid := range []string{m1.SessionId, n1.SessionId} {
					s, err := w.store.Session(w.ctx, sid)
					if err != nil {
						t.Fatal(err)
					}
					if s.Epoch != tt.want[i] {
						t.Errorf("session %d (%s) epoch = %d, want %d", i+1, sid, s.Epoch, tt.want[i])
					}
				}
				if tt.cluster {
					if o, err := w.store.Ownership(w.ctx, w.key); err != nil || o.Epoch != tt.want[1] || o.Owner != "a" {
						t.Errorf("Ownership(%s) = %+v, %v; want epoch %d by a", w.key, o, err, tt.want[1])
					}
				}
			})
		})
	}
}
