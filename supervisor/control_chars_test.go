package supervisor

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/bwmarrin/discordgo"

	"github.com/agentgate/agentgate/agents"
	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil"
	"github.com/agentgate/agentgate/persistence"
	"github.com/agentgate/agentgate/platforms/discord/discordtest"
	httpplatform "github.com/agentgate/agentgate/platforms/http"
	"github.com/agentgate/agentgate/platforms/platformtest"
)

// TestAgentControlCharactersReachNoChat: an exec command's reply with control characters, a NUL
// and a byte that is not UTF-8 reaches Discord (the fake, which strips and refuses as Discord
// does) and the HTTP API without the control characters but tab, line feed, carriage return and
// ESC, its NUL and its bad byte as U+FFFD, and the transcript stores what was sent. A reply of
// nothing but control characters is an empty reply: nothing is posted, and it is not refused.
// Before, Discord got "a\x07b…", and refused the reply of control characters as empty (50006),
// which was logged at ERR as refused for good, and recorded failed.
func TestAgentControlCharactersReachNoChat(t *testing.T) {
	const (
		dm   = "300000000000000001"
		want = "ab\uFFFDc\uFFFDd\x1b[1mbold\x1b[0m\r\nend\tx"
	)
	srv := discordtest.New(t)
	srv.AddChannel(discordtest.Channel{ID: dm, Type: discordgo.ChannelTypeDM})
	t.Setenv("AGTEST_BOT_TOKEN", srv.Token())
	// The message "first" is answered with control characters only, any other with text
	// holding them.
	agent := MustExecAgent(t, `if grep -q '"text":"first"'; then printf '\007\010\001\177\n'; else printf 'a\007b\000c\377d\033[1mbold\033[0m\r\nend\t\302\205x\n'; fi`)
	var logs testutil.Buffer
	r := MustStartDaemon(t, agent, daemonOpts{logs: &logs, tweak: func(c *config.Config) {
		c.Platforms.Discord.Enabled, c.Platforms.Discord.APIURL = true, srv.APIURL()
		c.Platforms.Discord.TokenEnv = "AGTEST_BOT_TOKEN"
	}})
	defer r.stop(t)
	srv.WaitReady(t)

	// replies waits until key's session has n replies, and returns their texts as stored.
	replies := func(key string, n int) []string {
		t.Helper()
		var texts []string
		waitUntil(t, func() bool {
			ss, err := r.d.store.SessionsOfKey(t.Context(), key, 10)
			if err != nil || len(ss) != 1 {
				return false
			}
			msgs, err := r.d.store.Transcript(t.Context(), ss[0].ID)
			if err != nil {
				return false
			}
			texts = nil
			for _, m := range msgs {
				if m.Role == persistence.RoleAssistant {
					texts = append(texts, m.Content)
				}
			}
			return len(texts) >= n
		})
		return texts
	}
	wantStored := []string{"", want}

	t.Run("discord", func(t *testing.T) {
		alice := discordtest.User{ID: "400000000000000001", Username: "alice"}
		key := "agent:main:discord:dm:" + dm
		srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "first"})
		replies(key, 1)
		srv.Post(discordtest.UserMessage{ChannelID: dm, Author: alice, Content: "second"})
		srv.WaitSent(t, dm, 1) // the reply to second, posted after the first's (one queue)
		if got := srv.Posted(dm); !slices.Equal(got, []string{want}) {
			t.Errorf("posted %q, want only %q", got, want)
		}
		if got := replies(key, 2); !slices.Equal(got, wantStored) {
			t.Errorf("stored replies %q, want %q", got, wantStored)
		}
		if l := logs.String(); strings.Contains(l, "refused the message for good") {
			t.Errorf("a reply was refused:\n%s", grepLines(l, "refused the message for good"))
		}
	})

	t.Run("http", func(t *testing.T) {
		key := "agent:main:http:dm:ctl"
		for i, id := range []string{"first", "second"} {
			if status, b := r.postMessage(t, map[string]string{"chat_id": "ctl", "user_id": "ann", "text": id, "message_id": id}); status != http.StatusAccepted {
				t.Fatalf("POST %s = %d %s", id, status, b)
			}
			replies(key, i+1)
		}
		resp, err := http.Get("http://" + r.d.Addr().String() + "/v1/sessions/" + key + "/transcript")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET transcript = %d %v", resp.StatusCode, err)
		}
		if !utf8.Valid(b) {
			t.Errorf("the transcript's body is not UTF-8: %q", b)
		}
		var page httpplatform.Transcript
		if err := json.Unmarshal(b, &page); err != nil {
			t.Fatalf("transcript body %s: %v", b, err)
		}
		var got []string
		for _, m := range page.Messages {
			if m.Role == persistence.RoleAssistant {
				got = append(got, m.Text)
			}
		}
		if !slices.Equal(got, wantStored) {
			t.Errorf("the transcript's replies %q, want %q", got, wantStored)
		}
		if got := replies(key, 2); !slices.Equal(got, wantStored) {
			t.Errorf("stored replies %q, want %q", got, wantStored)
		}
	})
}

// TestDraftShowsNoControlCharacters: a streaming reply's draft shows its text as the final reply
// will (shownText): without control characters, its NUL as U+FFFD; a text of control
// characters only posts no draft. Before, the draft showed them as the agent gave them, and
// was refused by Discord as empty when there was nothing else. A text that ends with half a
// character (an emoji whose last bytes are still on their way) shows on its draft without it,
// not with U+FFFD in its place, and the final reply shows it whole (its subtest "half a
// character"; before, the draft showed "ab\uFFFD").
func TestDraftShowsNoControlCharacters(t *testing.T) {
	for _, tc := range []struct {
		name     string
		partials []string
		final    string
		want     []string // the draft's texts
	}{
		{"control characters", []string{"\x07\x08", "a\x07b\x00c"}, "a\x07b\x00c d", []string{"ab\uFFFDc", "ab\uFFFDc d"}},
		{"half a character", []string{"ab\xf0\x9f"}, "ab\U0001F600", []string{"ab", "ab\U0001F600"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The turn ends once its draft shows: a draft is posted only once the platform has
			// read the drafts earlier runs left (draftsHeld), and a turn that ended before that
			// read was answered (a loaded host) posted its reply without one.
			shown := make(chan struct{})
			agent := agents.Func(func(ctx context.Context, req *agents.Request) (*agents.Response, error) {
				for _, p := range tc.partials {
					req.Partial(p)
				}
				select {
				case <-shown:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return &agents.Response{Text: tc.final}, nil
			})
			r := MustStartDaemon(t, agent, daemonOpts{editor: true, draftInterval: time.Nanosecond})
			defer r.stop(t)
			r.inject(t, dm, "m1", "hello")
			r.waitDrafts(t, "the draft", func(ds []platformtest.Draft) bool { return len(ds) == 1 && len(ds[0].Texts) > 0 })
			close(shown)
			r.waitSent(t, 1)
			waitUntil(t, func() bool { ds := r.editor.Drafts(); return len(ds) != 1 || ds[0].Final })
			if ds := r.editor.Drafts(); len(ds) != 1 || !slices.Equal(ds[0].Texts, tc.want) {
				t.Errorf("drafts = %+v, want one showing %q", ds, tc.want)
			}
		})
	}
}

// TestDraftOfALongReplyCostsItsLength: the drafts of a reply streamed a little at a time clean
// only what each step adds (shownGrowth). Before, each step cleaned the whole text so far: a
// reply of n bytes was scanned some n²/(2×step) bytes over, and once it held a control
// character each step copied it whole (here some 200 MB for a reply of 200 KiB).
func TestDraftOfALongReplyCostsItsLength(t *testing.T) {
	const steps, step = 3200, 64
	var allocated uint64
	agent := agents.Func(func(_ context.Context, req *agents.Request) (*agents.Response, error) {
		var b strings.Builder
		b.Grow(steps * step)
		b.WriteString("a\x07") // one control character, taken out
		chunk := strings.Repeat("x", step-1) + " "
		var before, after goruntime.MemStats
		goruntime.ReadMemStats(&before)
		for range steps {
			b.WriteString(chunk)
			req.Partial(b.String())
		}
		goruntime.ReadMemStats(&after)
		allocated = after.TotalAlloc - before.TotalAlloc
		return &agents.Response{Text: b.String()}, nil
	})
	r := MustStartDaemon(t, agent, daemonOpts{editor: true, draftInterval: time.Hour})
	defer r.stop(t)
	r.inject(t, dm, "m1", "hello")
	r.waitSent(t, 1)
	// The text is 200 KiB: its cleaned copy grows to twice that, once; the rest of the daemon
	// (the draft texts sent, the first post) allocates far less than the bound.
	if limit := uint64(32 << 20); allocated > limit {
		t.Errorf("%d steps of a %d-byte reply allocated %d MiB, want at most %d MiB", steps, steps*step, allocated>>20, limit>>20)
	}
	if got, want := r.fake.Sent(), "a"+strings.Repeat(strings.Repeat("x", step-1)+" ", steps); len(got) != 1 || got[0].Text != want {
		t.Errorf("the reply was not sent whole without its control character")
	}
}
