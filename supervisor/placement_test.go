package supervisor

import (
	"net"
	"slices"
	"strconv"
	"testing"

	"github.com/asynkron/protoactor-go/cluster"
)

// TestCrowdedAddresses: three or more members whose cluster addresses differ from this one's
// only in their last character are named (the cluster places about half of their keys on one of
// them); two such members, or addresses that differ earlier, are not (their split is even).
func TestCrowdedAddresses(t *testing.T) {
	members := func(addrs ...string) []*cluster.Member {
		var ms []*cluster.Member
		for _, a := range addrs {
			host, port, _ := net.SplitHostPort(a)
			p, _ := strconv.Atoi(port)
			ms = append(ms, &cluster.Member{Id: a, Host: host, Port: int32(p)})
		}
		return ms
	}
	for _, tc := range []struct {
		name    string
		me      string
		members []*cluster.Member
		want    []string
	}{
		{"three consecutive ports", "127.0.0.1:19612",
			members("127.0.0.1:19611", "127.0.0.1:19612", "127.0.0.1:19613"),
			[]string{"127.0.0.1:19611", "127.0.0.1:19612", "127.0.0.1:19613"}},
		{"three of four", "127.0.0.1:6340",
			members("127.0.0.1:6340", "127.0.0.1:6345", "127.0.0.1:6349", "127.0.0.1:7340"),
			[]string{"127.0.0.1:6340", "127.0.0.1:6345", "127.0.0.1:6349"}},
		{"two", "127.0.0.1:6340", members("127.0.0.1:6340", "127.0.0.1:6341"), nil},
		{"this member apart", "127.0.0.1:7340", members("127.0.0.1:6340", "127.0.0.1:6341", "127.0.0.1:6342", "127.0.0.1:7340"), nil},
		{"loopback addresses", "127.0.0.2:6340", members("127.0.0.2:6340", "127.0.0.3:6340", "127.0.0.4:6340"), nil},
		{"ports far apart", "127.0.0.1:16340", members("127.0.0.1:16340", "127.0.0.1:26340", "127.0.0.1:36340"), nil},
		{"not yet joined", "", members("127.0.0.1:19611", "127.0.0.1:19612", "127.0.0.1:19613"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := crowdedAddresses(tc.me, tc.members); !slices.Equal(got, tc.want) {
				t.Errorf("crowdedAddresses(%s) = %v, want %v", tc.me, got, tc.want)
			}
		})
	}
}
