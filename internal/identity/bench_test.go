package identity

import (
	"testing"
)

// BenchmarkKey measures building a session key from a Source, the one step every inbound
// message takes before it is routed. Each case reports ns/key and allocs/key (the same as
// ns/op and allocs/op: one key per op), so the cost can be read next to the per-turn routing
// figures of supervisor.BenchmarkRoutingKeys.
func BenchmarkKey(b *testing.B) {
	for _, tc := range []struct {
		name string
		src  Source
	}{
		{"dm", Source{Platform: "discord", ChatType: ChatDM, ChatID: "1187263544729837568", UserID: "902341877261475840"}},
		{"group_per_user", Source{Platform: "discord", ChatType: ChatGroup, ChatID: "1187263544729837568",
			UserID: "902341877261475840", ScopeID: "1012345678901234567"}},
		{"thread_profile", Source{Platform: "http", ChatType: ChatChannel, ChatID: "general",
			ThreadID: "1187263544729837999", UserID: "alice", Profile: "support"}},
		{"escaped", Source{Platform: "http", ChatType: ChatDM, ChatID: "team:ops/alerts%", UserID: "bob"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			var key string
			for b.Loop() {
				key = Key(tc.src, DefaultKeyOptions)
			}
			if _, err := ParseKey(key); err != nil {
				b.Fatalf("ParseKey(%q): %v", key, err)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/key")
		})
	}
}
