package discordtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/bwmarrin/discordgo"
	"github.com/gorilla/websocket"
)

// Gateway opcodes (https://discord.com/developers/docs/topics/opcodes-and-status-codes).
const (
	opDispatch       = 0
	opHeartbeat      = 1
	opIdentify       = 2
	opPresenceUpdate = 3
	opVoiceState     = 4
	opResume         = 6
	opRequestMembers = 8
	opInvalidSession = 9
	opHello          = 10
	opHeartbeatACK   = 11
)

// Gateway close codes the fake uses.
const (
	closeUnknownOpcode    = 4001
	closeDecodeError      = 4002
	closeNotAuthenticated = 4003
	closeAuthFailed       = 4004
	closeAlreadyAuthed    = 4005
	closeInvalidShard     = 4010
	closeShardingRequired = 4011
	closeInvalidVersion   = 4012
	closeInvalidIntents   = 4013
	closeDisallowed       = 4014
)

const (
	writeTimeout = 10 * time.Second
	// closeGrace bounds how long a connection the Server closed with a close code waits
	// for the client to hang up.
	closeGrace = 5 * time.Second
)

var upgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

// session is a gateway session: what RESUME continues. It outlives its connections.
type session struct {
	id      string
	intents discordgo.Intent
	seq     int64
	read    int64        // the highest sequence number a heartbeat of the client's carried
	log     []dispatched // every dispatch, for replay
	conn    *conn        // nil while the client is away
}

type dispatched struct {
	seq   int64
	event string
	frame []byte
}

// frame is a gateway payload.
type frame struct {
	Op int     `json:"op"`
	D  any     `json:"d"`
	S  *int64  `json:"s"`
	T  *string `json:"t"`
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("discordtest: encode: %v", err))
	}
	return b
}

// dispatchLocked sends an op 0 event with the session's next sequence number and keeps it
// for replay. Without a session it does nothing.
func (s *Server) dispatchLocked(event string, d any) {
	sess := s.sess
	if sess == nil {
		return
	}
	sess.seq++
	seq := sess.seq
	b := mustJSON(frame{Op: opDispatch, D: d, S: &seq, T: &event})
	sess.log = append(sess.log, dispatched{seq: seq, event: event, frame: b})
	if sess.conn != nil {
		sess.conn.send(b)
	}
}

// conn is one gateway websocket. The HTTP handler goroutine reads from it and handles
// every op; writeLoop is the only writer of data frames, so frames leave in the order
// send queued them.
type conn struct {
	ws   *websocket.Conn
	wake chan struct{} // buffered 1: there is something to write
	done chan struct{} // closed by abort

	mu      sync.Mutex
	queue   [][]byte
	closing []byte // a close frame to write after the queue; then the writer stops

	stop sync.Once

	identified bool // guarded by Server.mu
	heartbeats int  // guarded by Server.mu
}

func newConn(ws *websocket.Conn) *conn {
	return &conn{ws: ws, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func (c *conn) send(b []byte) {
	c.mu.Lock()
	if c.closing == nil {
		c.queue = append(c.queue, b)
	}
	c.mu.Unlock()
	c.poke()
}

// closeWith makes the writer send a close frame after what is queued, and stop.
func (c *conn) closeWith(code int, text string) {
	c.mu.Lock()
	if c.closing == nil {
		c.closing = websocket.FormatCloseMessage(code, text)
	}
	c.mu.Unlock()
	c.poke()
}

func (c *conn) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// abort closes the TCP connection at once, without a close frame.
func (c *conn) abort() {
	c.stop.Do(func() {
		close(c.done)
		c.ws.Close()
	})
}

func (c *conn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		c.mu.Lock()
		queue, closing := c.queue, c.closing
		c.queue = nil
		c.mu.Unlock()
		for _, b := range queue {
			c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
			if err := c.ws.WriteMessage(websocket.TextMessage, b); err != nil {
				c.abort()
				return
			}
		}
		if closing != nil {
			c.ws.WriteControl(websocket.CloseMessage, closing, time.Now().Add(writeTimeout))
			return
		}
	}
}

// serveGateway upgrades to a websocket, says HELLO and handles ops until the connection
// ends.
func (s *Server) serveGateway(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "server closed", http.StatusServiceUnavailable)
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()

	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade has answered
	}
	ws.SetReadLimit(1 << 20)
	c := newConn(ws)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ws.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Go(c.writeLoop)
	s.notifyLocked()
	s.mu.Unlock()

	c.send(mustJSON(frame{Op: opHello, D: map[string]any{"heartbeat_interval": s.heartbeat.Milliseconds()}}))
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				s.clientClosed(c, ce.Code)
			}
			break
		}
		s.handleFrame(c, data)
	}
	c.abort()
	s.mu.Lock()
	delete(s.conns, c)
	if s.sess != nil && s.sess.conn == c {
		s.sess.conn = nil
	}
	s.notifyLocked()
	s.mu.Unlock()
}

// clientClosed handles the close frame the client sent on c with code. As on Discord, a close
// with 1000 (normal closure) or 1001 (going away) ends the gateway session: the bot shows
// offline, and a RESUME of it gets op 9 INVALID_SESSION; the client's next connection must
// IDENTIFY, and what was dispatched meanwhile is lost. Any other code, like a connection dropped
// without a close frame, leaves the session resumable. A close frame that answers the
// Server's own (closeConn) ends nothing: the Server's code said what the session's fate is.
func (s *Server) clientClosed(c *conn, code int) {
	if code != websocket.CloseNormalClosure && code != websocket.CloseGoingAway {
		return // 1006, gorilla's for a connection dropped without a close frame, among them
	}
	c.mu.Lock()
	answered := c.closing != nil
	c.mu.Unlock()
	s.mu.Lock()
	if answered || s.sess == nil || s.sess.conn != c {
		s.mu.Unlock()
		return
	}
	id := s.sess.id
	s.sess = nil
	s.notifyLocked()
	s.mu.Unlock()
	s.logf("gateway: the client closed the connection with %d: session %s ends", code, id)
}

// handleFrame handles one payload from the client. It runs on the connection's reader
// goroutine, the only one that may call the websocket's read methods.
func (s *Server) handleFrame(c *conn, data []byte) {
	var f struct {
		Op *int            `json:"op"`
		D  json.RawMessage `json:"d"`
	}
	if err := json.Unmarshal(data, &f); err != nil || f.Op == nil {
		s.closeConn(c, closeDecodeError, "Error while decoding payload.")
		return
	}
	switch *f.Op {
	case opHeartbeat:
		var seq int64 // the last dispatch the client read; null before the first
		_ = json.Unmarshal(f.D, &seq)
		s.mu.Lock()
		s.heartbeats++
		c.heartbeats++
		if s.sess != nil && s.sess.conn == c {
			s.sess.read = max(s.sess.read, seq)
		}
		miss := s.missACKs > 0
		if miss {
			s.missACKs--
		}
		s.notifyLocked()
		s.mu.Unlock()
		if !miss {
			c.send(mustJSON(frame{Op: opHeartbeatACK}))
		}
	case opIdentify:
		s.identify(c, f.D)
	case opResume:
		s.resume(c, f.D)
	case opPresenceUpdate, opVoiceState, opRequestMembers:
		s.mu.Lock()
		ok := c.identified
		s.mu.Unlock()
		if !ok {
			s.closeConn(c, closeNotAuthenticated, "Not authenticated.")
		}
	default:
		s.closeConn(c, closeUnknownOpcode, "Unknown opcode.")
	}
}

// closeConn closes c with a gateway close code: the client gets the queued frames, then
// the close frame. The reader keeps reading until the client hangs up, or closeGrace.
func (s *Server) closeConn(c *conn, code int, text string) {
	s.logf("gateway: closing connection with %d %s", code, text)
	s.mu.Lock()
	if s.sess != nil && s.sess.conn == c {
		s.sess.conn = nil
	}
	s.notifyLocked()
	s.mu.Unlock()
	c.closeWith(code, text)
	c.ws.SetReadDeadline(time.Now().Add(closeGrace))
}

func (s *Server) tokenOK(token string) bool {
	return strings.TrimPrefix(token, "Bot ") == s.token
}

func (s *Server) identify(c *conn, d json.RawMessage) {
	var id struct {
		Token   string           `json:"token"`
		Intents discordgo.Intent `json:"intents"`
		Shard   *[2]int          `json:"shard"`
	}
	if err := json.Unmarshal(d, &id); err != nil {
		s.closeConn(c, closeDecodeError, "Error while decoding payload.")
		return
	}
	s.mu.Lock()
	if code, reason, ok := s.refuseLocked(); ok {
		s.mu.Unlock()
		s.closeConn(c, code, reason)
		return
	}
	switch {
	case c.identified:
		s.mu.Unlock()
		s.closeConn(c, closeAlreadyAuthed, "Already authenticated.")
		return
	case !s.tokenOK(id.Token):
		s.mu.Unlock()
		s.closeConn(c, closeAuthFailed, "Authentication failed.")
		return
	case id.Shard != nil && (id.Shard[1] < 1 || id.Shard[0] < 0 || id.Shard[0] >= id.Shard[1]):
		s.mu.Unlock()
		s.closeConn(c, closeInvalidShard, "Invalid shard.")
		return
	}
	s.identifies++
	s.intents = id.Intents
	s.shard = [2]int{0, 1}
	if id.Shard != nil {
		s.shard = *id.Shard
	}
	var old *conn
	if s.sess != nil && s.sess.conn != c {
		old = s.sess.conn
	}
	s.sessions++
	s.sess = &session{id: fmt.Sprintf("%032x", s.sessions), intents: id.Intents, conn: c}
	c.identified = true
	guilds := make([]any, len(s.guilds))
	for i, g := range s.guilds {
		guilds[i] = map[string]any{"id": g.id, "unavailable": true}
	}
	ready := map[string]any{
		"v":                  9,
		"user":               s.bot.wire(),
		"session_id":         s.sess.id,
		"resume_gateway_url": s.wsURL,
		"guilds":             guilds,
		"private_channels":   []any{},
		"application":        map[string]any{"id": s.bot.ID, "flags": 0},
	}
	if id.Shard != nil {
		ready["shard"] = s.shard
	}
	s.dispatchLocked("READY", ready)
	if id.Intents&discordgo.IntentsGuilds != 0 {
		for _, g := range s.guilds {
			s.dispatchLocked("GUILD_CREATE", s.guildWireLocked(g))
		}
	}
	sessionID := s.sess.id
	s.notifyLocked()
	s.mu.Unlock()
	s.logf("gateway: IDENTIFY accepted, session %s, intents %d", sessionID, id.Intents)
	if old != nil {
		old.abort() // one connection per bot: the new session replaces it
	}
}

// resumedWire is the payload of RESUMED.
var resumedWire = map[string]any{"_trace": []string{"discordtest"}}

// withheldResume is a RESUME whose replay was sent and whose RESUMED waits (WithholdResumed).
type withheldResume struct {
	sess *session
	conn *conn
}

// WithholdResumed makes the next RESUME replay what the client missed and then wait, without
// RESUMED, until release is called: a replay still in flight. RESUMED then goes to that
// connection if it is still the session's; a RESUME before it gets none either.
func (s *Server) WithholdResumed() (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.withhold = true
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.withhold = false
			if w := s.withheld; w != nil && s.sess == w.sess && w.sess.conn == w.conn {
				s.dispatchLocked("RESUMED", resumedWire)
			}
			s.withheld = nil
			s.notifyLocked()
		})
	}
}

func (s *Server) resume(c *conn, d json.RawMessage) {
	var rp struct {
		Token     string `json:"token"`
		SessionID string `json:"session_id"`
		Seq       int64  `json:"seq"`
	}
	if err := json.Unmarshal(d, &rp); err != nil {
		s.closeConn(c, closeDecodeError, "Error while decoding payload.")
		return
	}
	s.mu.Lock()
	if code, reason, ok := s.refuseLocked(); ok {
		s.mu.Unlock()
		s.closeConn(c, code, reason)
		return
	}
	switch {
	case c.identified:
		s.mu.Unlock()
		s.closeConn(c, closeAlreadyAuthed, "Already authenticated.")
		return
	case !s.tokenOK(rp.Token):
		s.mu.Unlock()
		s.closeConn(c, closeAuthFailed, "Authentication failed.")
		return
	case s.sess == nil || s.sess.id != rp.SessionID:
		s.mu.Unlock()
		s.logf("gateway: RESUME of unknown session %q: INVALID_SESSION", rp.SessionID)
		c.send(mustJSON(frame{Op: opInvalidSession, D: false}))
		return
	}
	sess := s.sess
	old := sess.conn
	sess.conn = c
	c.identified = true
	s.resumes++
	replayed := 0
	for _, e := range sess.log {
		if e.seq > rp.Seq && e.event != "READY" && e.event != "RESUMED" {
			c.send(e.frame)
			replayed++
		}
	}
	if s.withhold {
		s.withheld = &withheldResume{sess: sess, conn: c}
	} else {
		s.dispatchLocked("RESUMED", resumedWire)
	}
	s.notifyLocked()
	s.mu.Unlock()
	s.logf("gateway: RESUME of session %s from seq %d accepted, replayed %d event(s)", sess.id, rp.Seq, replayed)
	if old != nil && old != c {
		old.abort()
	}
}
