package discordtest_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentgate/agentgate/platforms/discord/discordtest"
)

// payload is a gateway frame as the client sees it.
type payload struct {
	Op int             `json:"op"`
	D  json.RawMessage `json:"d"`
	S  *int64          `json:"s"`
	T  *string         `json:"t"`
}

// mustDial opens a raw gateway connection and reads HELLO.
func mustDial(t *testing.T, srv *discordtest.Server) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial(srv.GatewayURL()+"/?v=9&encoding=json", nil)
	if err != nil {
		t.Fatalf("dial gateway: %v", err)
	}
	t.Cleanup(func() { ws.Close() })
	hello := mustRead(t, ws)
	var d struct {
		HeartbeatInterval int64 `json:"heartbeat_interval"`
	}
	if err := json.Unmarshal(hello.D, &d); hello.Op != 10 || err != nil || d.HeartbeatInterval != 41250 {
		t.Fatalf("first frame op %d %s, want op 10 HELLO with heartbeat_interval 41250", hello.Op, hello.D)
	}
	return ws
}

func mustRead(t *testing.T, ws *websocket.Conn) payload {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(discordtest.WaitTimeout))
	mt, b, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("read gateway frame: %v", err)
	}
	if mt != websocket.TextMessage {
		t.Fatalf("frame type %d, want text (discordgo inflates binary frames)", mt)
	}
	var p payload
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return p
}

func mustWrite(t *testing.T, ws *websocket.Conn, v any) {
	t.Helper()
	if err := ws.WriteJSON(v); err != nil {
		t.Fatalf("write gateway frame: %v", err)
	}
}

// mustDispatch reads a frame and checks that it is the dispatch event with sequence seq.
func mustDispatch(t *testing.T, ws *websocket.Conn, event string, seq int64) payload {
	t.Helper()
	p := mustRead(t, ws)
	if p.Op != 0 || p.T == nil || *p.T != event || p.S == nil || *p.S != seq {
		t.Fatalf("frame op %d t %v s %v, want op 0 %s s %d: %s", p.Op, deref(p.T), deref(p.S), event, seq, p.D)
	}
	return p
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func identify(token string, intents int) map[string]any {
	return map[string]any{"op": 2, "d": map[string]any{"token": token, "intents": intents, "properties": map[string]any{}}}
}

func TestGatewayProtocol(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)

	// Without a session, nothing is dispatched: the bot was offline.
	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "offline"})
	ws := mustDial(t, srv)
	mustWrite(t, ws, map[string]any{"op": 1, "d": nil})
	if p := mustRead(t, ws); p.Op != 11 {
		t.Fatalf("reply to heartbeat: op %d, want 11", p.Op)
	}
	mustWrite(t, ws, identify(srv.Token(), int(allIntents)))
	ready := mustDispatch(t, ws, "READY", 1)
	var r struct {
		V         int    `json:"v"`
		SessionID string `json:"session_id"`
		Resume    string `json:"resume_gateway_url"`
		User      struct {
			ID  string `json:"id"`
			Bot bool   `json:"bot"`
		} `json:"user"`
		Guilds []struct {
			ID          string `json:"id"`
			Unavailable bool   `json:"unavailable"`
		} `json:"guilds"`
	}
	if err := json.Unmarshal(ready.D, &r); err != nil {
		t.Fatalf("decode READY: %v", err)
	}
	if r.V != 9 || r.SessionID == "" || r.Resume == "" || r.User.ID != srv.BotID() || !r.User.Bot ||
		len(r.Guilds) != 1 || r.Guilds[0].ID != guildID || !r.Guilds[0].Unavailable {
		t.Errorf("READY = %s", ready.D)
	}
	mustDispatch(t, ws, "GUILD_CREATE", 2)
	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Nick: "Ally", Content: "one"})
	var m struct {
		Content string `json:"content"`
		GuildID string `json:"guild_id"`
		Member  struct {
			Nick string `json:"nick"`
		} `json:"member"`
	}
	if err := json.Unmarshal(mustDispatch(t, ws, "MESSAGE_CREATE", 3).D, &m); err != nil || m.Content != "one" ||
		m.GuildID != guildID || m.Member.Nick != "Ally" {
		t.Errorf("MESSAGE_CREATE = %+v, %v; want \"one\" in %s by Ally", m, err, guildID)
	}
	ws.Close()
	srv.WaitFor(t, "the server to notice the closed connection", func() bool { return !srv.Ready() })

	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "two"})
	ws2 := mustDial(t, srv)
	mustWrite(t, ws2, map[string]any{"op": 6, "d": map[string]any{"token": "Bot " + srv.Token(), "session_id": r.SessionID, "seq": 2}})
	mustDispatch(t, ws2, "MESSAGE_CREATE", 3)
	mustDispatch(t, ws2, "MESSAGE_CREATE", 4)
	mustDispatch(t, ws2, "RESUMED", 5)
	srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "three"})
	mustDispatch(t, ws2, "MESSAGE_CREATE", 6)

	ws3 := mustDial(t, srv)
	mustWrite(t, ws3, map[string]any{"op": 6, "d": map[string]any{"token": srv.Token(), "session_id": "nope", "seq": 1}})
	if p := mustRead(t, ws3); p.Op != 9 || string(p.D) != "false" {
		t.Errorf("RESUME of an unknown session: op %d d %s, want op 9 d false", p.Op, p.D)
	}
}

func TestGatewayCloseCodes(t *testing.T) {
	t.Parallel()
	srv := newWorld(t)
	tests := []struct {
		name   string
		frames []any
		want   int
	}{
		{"wrong token", []any{identify("wrong", 0)}, 4004},
		{"unknown opcode", []any{map[string]any{"op": 42}}, 4001},
		{"not json", []any{"garbage"}, 4002},
		{"presence before identify", []any{map[string]any{"op": 3, "d": map[string]any{}}}, 4003},
		{"identify twice", []any{identify(srv.Token(), 0), identify(srv.Token(), 0)}, 4005},
		{"bad shard", []any{map[string]any{"op": 2, "d": map[string]any{"token": srv.Token(), "shard": []int{2, 2}}}}, 4010},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := mustDial(t, srv)
			for _, f := range tt.frames {
				mustWrite(t, ws, f)
			}
			ws.SetReadDeadline(time.Now().Add(discordtest.WaitTimeout))
			for {
				_, b, err := ws.ReadMessage()
				var ce *websocket.CloseError
				if errors.As(err, &ce) {
					if ce.Code != tt.want {
						t.Errorf("closed with %d %q, want %d", ce.Code, ce.Text, tt.want)
					}
					return
				}
				if err != nil {
					t.Fatalf("read: %v, want close %d", err, tt.want)
				}
				t.Logf("frame before close: %s", b)
			}
		})
	}
}

// A client's close frame decides whether its gateway session lives on, as on Discord: 1000 and
// 1001 end it (a RESUME gets op 9 INVALID_SESSION, false), any other code keeps it resumable,
// and the RESUME replays what was dispatched meanwhile.
func TestClientCloseCodeDecidesTheResume(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		code      int
		resumable bool
	}{
		{websocket.CloseNormalClosure, false},
		{websocket.CloseGoingAway, false},
		{4000, true},
		{websocket.CloseServiceRestart, true},
	} {
		t.Run(strconv.Itoa(tt.code), func(t *testing.T) {
			t.Parallel()
			srv := newWorld(t)
			ws := mustDial(t, srv)
			mustWrite(t, ws, identify(srv.Token(), int(allIntents)))
			var r struct {
				SessionID string `json:"session_id"`
			}
			if err := json.Unmarshal(mustDispatch(t, ws, "READY", 1).D, &r); err != nil {
				t.Fatalf("decode READY: %v", err)
			}
			mustDispatch(t, ws, "GUILD_CREATE", 2)
			mustWrite(t, ws, map[string]any{"op": 1, "d": 2}) // Ready from now on, until the server has handled the close
			if p := mustRead(t, ws); p.Op != 11 {
				t.Fatalf("reply to heartbeat: op %d, want 11", p.Op)
			}
			if err := ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(tt.code, ""), time.Now().Add(discordtest.WaitTimeout)); err != nil {
				t.Fatalf("write close frame: %v", err)
			}
			srv.WaitFor(t, "the server to notice the closed connection", func() bool { return !srv.Ready() })
			ws.Close()

			srv.Post(discordtest.UserMessage{ChannelID: channelID, Author: alice, Content: "while away"})
			ws2 := mustDial(t, srv)
			mustWrite(t, ws2, map[string]any{"op": 6, "d": map[string]any{"token": srv.Token(), "session_id": r.SessionID, "seq": 2}})
			if !tt.resumable {
				if p := mustRead(t, ws2); p.Op != 9 || string(p.D) != "false" {
					t.Errorf("RESUME after a close with %d: op %d d %s, want op 9 d false", tt.code, p.Op, p.D)
				}
				return
			}
			mustDispatch(t, ws2, "MESSAGE_CREATE", 3)
			mustDispatch(t, ws2, "RESUMED", 4)
		})
	}
}
