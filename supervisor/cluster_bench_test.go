//go:build !race

package supervisor

import (
	"fmt"
	"testing"

	"github.com/agentgate/agentgate/agents/echo"
	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
	"github.com/agentgate/agentgate/platforms"
)

// BenchmarkClusterDeliver measures what routing through the cluster costs a message: the time
// from intake to its durable acknowledgment, on a member of a two-member cluster (one shared
// PostgreSQL database, fsync on), for a chat whose session runs on that member ("local") and
// for one whose session runs on the other ("remote": a gRPC hop each way). The two run in the
// same process, one after the other; their difference is the hop. "activate" is a chat's first
// message: its session starts on the key's owner, which asks the other member to let go of the
// key before it claims and loads it.
func BenchmarkClusterDeliver(b *testing.B) {
	dsn := pgtest.NewDatabase(b)
	var rs []*runtime
	for range 2 {
		rs = append(rs, startClusterMember(b, dsn, echo.New(), 0))
	}
	defer func() {
		for _, r := range rs {
			r.stop(b)
		}
	}()
	a := rs[0]
	waitUntil(b, func() bool {
		return len(a.d.cluster.MemberList.Members().Members()) == 2 && len(rs[1].d.cluster.MemberList.Members().Members()) == 2
	})
	src := func(chat string) identity.Source {
		return identity.Source{Platform: "fake", ChatType: identity.ChatDM, ChatID: chat, UserID: "u"}
	}
	chats := map[bool]string{} // remote? → a chat placed so
	for i := 0; len(chats) < 2; i++ {
		chat := fmt.Sprint("bench", i)
		remote := a.d.managerOf(a.d.intake.Key(src(chat))).Address != a.d.manager.Address
		if _, ok := chats[remote]; !ok {
			chats[remote] = chat
		}
	}
	for _, c := range []struct {
		name   string
		remote bool
	}{{"local", false}, {"remote", true}} {
		b.Run(c.name, func(b *testing.B) {
			chat := chats[c.remote]
			n := 0
			for b.Loop() {
				n++
				ack, err := a.d.intake.Deliver(b.Context(), &platforms.Inbound{Source: src(chat),
					MessageID: fmt.Sprint(c.name, n), Text: "hello"})
				if err != nil || ack == nil {
					b.Fatalf("deliver: %v", err)
				}
			}
		})
	}
	// A chat's first message activates its session on the key's owner, which first asks the other
	// member to let go of the key (actors.Release), then claims and loads it.
	b.Run("activate", func(b *testing.B) {
		n := 0
		for b.Loop() {
			n++
			ack, err := a.d.intake.Deliver(b.Context(), &platforms.Inbound{Source: src(fmt.Sprint("new", n)),
				MessageID: fmt.Sprint("first", n), Text: "hello"})
			if err != nil || ack == nil {
				b.Fatalf("deliver: %v", err)
			}
		}
	})
}
