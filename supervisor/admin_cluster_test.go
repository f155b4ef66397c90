//go:build !race

// A cluster test: run without the race detector, as cluster_test.go says.

package supervisor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	httpplatform "github.com/agentgate/agentgate/platforms/http"
)

// TestClusterLiveStateNamesTheMembersAddress: GET /v1/sessions/{key} on any member names, in
// live.member_address, the cluster address of the member that runs the session, and in
// live.node the name that member claims it under in the store. Before, only node was there: a
// host name and a run id, which no operator could dial.
func TestClusterLiveStateNamesTheMembersAddress(t *testing.T) {
	rs := startClusterMembers(t, 2, okAgent, 0)
	defer stopAll(t, rs)
	owners := map[*runtime]string{} // a key each member runs
	for i := 0; len(owners) < 2; i++ {
		if i == 60 {
			t.Fatalf("60 chats ran on %d member(s), want both", len(owners))
		}
		body := fmt.Sprintf(`{"chat_id":"w%d","user_id":"u","text":"hello","message_id":"w%d"}`, i, i)
		resp, err := http.Post("http://"+rs[0].d.Addr().String()+"/v1/messages?wait=20s", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var ack httpplatform.MessageResponse
		err = json.NewDecoder(resp.Body).Decode(&ack)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("chat w%d: status %d, want 200 with its reply", i, resp.StatusCode)
		}
		own, err := rs[0].d.store.Ownership(t.Context(), ack.SessionKey)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if own.Owner == r.d.deps.Node && owners[r] == "" {
				owners[r] = ack.SessionKey
			}
		}
	}
	for owner, key := range owners {
		for i, asked := range rs {
			status, body := getJSON(t, "http://"+asked.d.Addr().String()+"/v1/sessions/"+url.PathEscape(key))
			var info httpplatform.SessionInfo
			if err := json.Unmarshal(body, &info); err != nil || status != http.StatusOK || info.Live == nil {
				t.Fatalf("GET %s on member %d = %d %s, want 200 with live state", key, i, status, body)
			}
			if info.Live.MemberAddress != owner.d.system.Address() || info.Live.Node != owner.d.deps.Node {
				t.Errorf("GET %s on member %d: live member_address %q, node %q; want the owner's, %q and %q",
					key, i, info.Live.MemberAddress, info.Live.Node, owner.d.system.Address(), owner.d.deps.Node)
			}
		}
	}
}
