package http

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/internal/logging"
	"github.com/agentgate/agentgate/platforms"
)

// handleMessages is POST /v1/messages.
func (p *Platform) handleMessages(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if p.draining.Load() {
		p.writeDraining(w, "agentgate is draining and accepts no new messages", "")
		return
	}
	wait, aerr := p.parseWait(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	in, aerr := decodeMessage(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	deliver, stop := p.currentDeliver()
	if deliver == nil {
		setRetryAfter(w, retrySoon)
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "platform not running")
		return
	}
	if wait > 0 {
		release, ok := p.hold(w, "?wait")
		if !ok {
			return
		}
		defer release()
	}

	// The waiter exists before the message is delivered: a fast turn may answer before
	// deliver returns.
	var wt *waiter
	if wait > 0 {
		wt = p.addWaiter(in.Source.ChatID, in.MessageID)
		defer p.removeWaiter(wt)
	}

	ack, err := deliverUntilStop(r.Context(), stop, deliver, in)
	if err != nil {
		p.writeDeliverError(w, ack, in, err)
		return
	}
	if ack == nil {
		p.log.Error("deliver returned no ack and no error")
		writeError(w, http.StatusInternalServerError, CodeInternal, "internal error")
		return
	}
	if ack.Disposition == platforms.Rejected {
		writeRejected(w, ack, "the session's queue is full")
		return
	}
	p.log.Debug("message accepted", "session", ack.SessionKey, "message_id", cmpOr(ack.MessageID, in.MessageID), "disposition", ack.Disposition)

	resp := MessageResponse{
		MessageID:   cmpOr(ack.MessageID, in.MessageID),
		SessionKey:  ack.SessionKey,
		SessionID:   ack.SessionID,
		Disposition: ack.Disposition,
		QueueDepth:  ack.QueueDepth,
	}
	if wt == nil {
		writeJSON(w, http.StatusAccepted, resp)
		return
	}
	replies, ok := p.awaitReplies(r.Context(), stop, wt, ack, start.Add(wait), true)
	if !ok {
		// The message is durable and will be answered; SSE carries the replies.
		writeJSON(w, http.StatusAccepted, resp)
		return
	}
	resp.Replies = make([]Reply, len(replies))
	for i, o := range replies {
		resp.Replies[i] = Reply{Text: o.Text, TurnID: o.TurnID, Kind: eventKind(o.Kind), Seq: o.Seq}
	}
	// A command such as /new changes the session; the last reply carries the live one.
	if sid := replies[len(replies)-1].SessionID; sid != "" {
		resp.SessionID = sid
	}
	writeJSON(w, http.StatusOK, resp)
}

func (p *Platform) parseWait(r *http.Request) (time.Duration, *apiError) {
	q, aerr := query(r, "wait")
	if aerr != nil {
		return 0, aerr
	}
	if !q.Has("wait") {
		return 0, nil
	}
	v := q.Get("wait")
	d, err := time.ParseDuration(v)
	if err != nil && durationSyntax.MatchString(v) {
		// ParseDuration answers a duration too long for a time.Duration (292 years) with the
		// error it gives garbage; one with a duration's syntax is such a one. It is a wait
		// longer than MaxWait like any other, read as MaxWait, or negative, and refused.
		d, err = math.MaxInt64, nil
		if strings.HasPrefix(v, "-") {
			d = math.MinInt64
		}
	}
	switch {
	case err != nil:
		return 0, badRequest(CodeInvalidWait, fmt.Sprintf("wait must be a Go duration such as 30s or 2m, not %.40q", v))
	case d < 0:
		return 0, badRequest(CodeInvalidWait, fmt.Sprintf("wait must not be negative, as %.40q is", v))
	}
	return min(d, p.cfg.MaxWait), nil
}

// durationSyntax is the syntax time.ParseDuration takes, with its units: a string it refuses
// that has this syntax is too long for a time.Duration.
var durationSyntax = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

// deliverUntilStop delivers in under ctx, ended early by the platform's stop (stop): a delivery
// not answered by then is answered draining, as one whose session stopped with the daemon is (the
// message may be stored; sent again after the restart, or to another member, it is stored once).
// A cluster member's router sends a message again and again while its grain meets a dead letter,
// until the request's deadline, 30 s: one the member routed to a session on itself after its stop
// had stopped its session manager held the platform's stop for its 5 s, which then closed the
// connection with no answer at all (a black-box cluster soak: 7 POSTs over 128 stops).
func deliverUntilStop(ctx context.Context, stop <-chan struct{}, deliver platforms.Deliver, in *platforms.Inbound) (*platforms.Ack, error) {
	ctx, cancel := cancelAtStop(ctx, stop)
	defer cancel()
	ack, err := deliver(ctx, in)
	select {
	case <-stop:
		// Only a delivery the stop cut: an answer that came as it stopped (a full queue, an id
		// already used) is the client's to hear.
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return ack, fmt.Errorf("%w: %w", platforms.ErrDraining, err)
		}
	default:
	}
	return ack, err
}

// cancelAtStop is ctx, also ended when stop is closed (the platform stops); the caller must call
// the cancel returned, which ends the goroutine that waits for stop.
func cancelAtStop(ctx context.Context, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (p *Platform) writeDeliverError(w http.ResponseWriter, ack *platforms.Ack, in *platforms.Inbound, err error) {
	// First: an OutdatedMemberError is ErrUnavailable too, which would answer it unavailable.
	if oe, ok := errors.AsType[*platforms.OutdatedMemberError](err); ok {
		writeOutdated(w, oe, in.MessageID)
		return
	}
	switch {
	case errors.Is(err, platforms.ErrDraining):
		p.writeDraining(w, "agentgate is draining and accepts no new messages", in.MessageID)
	case errors.Is(err, platforms.ErrRejected):
		writeRejected(w, ack, "the session's queue is full")
	case errors.Is(err, platforms.ErrConflict):
		writeError(w, http.StatusConflict, CodeMessageIDConflict, "message_id is already used in this chat by another conversation; give each message its own id")
	case errors.Is(err, platforms.ErrReused):
		writeError(w, http.StatusConflict, CodeMessageIDReused, "message_id is already used in this chat for another message (by another user, or with another text); send this message with a new message_id")
	case errors.Is(err, platforms.ErrUnavailable):
		p.unstored.LogQuiet(p.log, slog.LevelWarn, "message not stored; the client is told to send it again", "chat", in.Source.ChatID, "message_id", in.MessageID, logging.Err(err))
		setRetryAfter(w, retrySoon)
		writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: APIError{Code: CodeUnavailable,
			Message: "the message could not be stored, retry later"}, MessageID: in.MessageID})
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// It may have been stored: the answer names its id, also one agentgate made (the
		// client that sent none could not send it again with it, and its retry ran twice).
		setRetryAfter(w, retrySoon)
		writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: APIError{Code: CodeUnavailable,
			Message: "the message was not acknowledged in time, retry with the same message_id"}, MessageID: in.MessageID})
	default:
		p.log.Error("deliver failed", "chat", in.Source.ChatID, "message_id", in.MessageID, logging.Err(err))
		writeError(w, http.StatusInternalServerError, CodeInternal, "internal error")
	}
}

func writeRejected(w http.ResponseWriter, ack *platforms.Ack, msg string) {
	body := RejectedResponse{
		Disposition: platforms.Rejected,
		Error:       APIError{Code: CodeQueueFull, Message: msg},
	}
	if ack != nil {
		body.MessageID = ack.MessageID
		body.SessionKey = ack.SessionKey
		body.SessionID = ack.SessionID
		body.QueueDepth = ack.QueueDepth
	}
	setRetryAfter(w, retrySoon)
	writeJSON(w, http.StatusTooManyRequests, body)
}

// decodeMessage reads, checks and converts the body of POST /v1/messages.
func decodeMessage(w http.ResponseWriter, r *http.Request) (*platforms.Inbound, *apiError) {
	if aerr := checkContentEncoding(w, r); aerr != nil {
		return nil, aerr
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, params, err := mime.ParseMediaType(ct)
		if cs, ok := params["charset"]; err == nil && mt == "application/json" && ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
			// JSON is UTF-8 (RFC 8259): a body its sender says is Latin-1 and that happens
			// to be valid UTF-8 would be stored as other characters than it meant.
			return nil, &apiError{http.StatusUnsupportedMediaType, CodeUnsupportedMedia,
				fmt.Sprintf("the body must be JSON in UTF-8, not charset=%.40q; send it in UTF-8 and leave out the charset, or say utf-8", cs)}
		}
		if err != nil || mt != "application/json" {
			sent := "a malformed Content-Type"
			if err == nil {
				sent = fmt.Sprintf("%.100q", mt)
			}
			// curl -d sends a form type: the first thing a new user meets.
			return nil, &apiError{http.StatusUnsupportedMediaType, CodeUnsupportedMedia,
				"the body must be JSON, sent as Content-Type: application/json (or with no Content-Type), not " + sent +
					"; with curl, add -H 'Content-Type: application/json'"}
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
				fmt.Sprintf("the body exceeds %d bytes", MaxBodyBytes)}
		}
		return nil, badRequest(CodeInvalidJSON, "the body could not be read")
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{}) // read whole: see limitBody
	if !utf8.Valid(body) {
		return nil, badRequest(CodeInvalidUTF8, "the body is not valid UTF-8")
	}
	req, aerr := parseMessageRequest(body)
	if aerr != nil {
		return nil, aerr
	}
	if esc, ok := loneSurrogate(body); ok {
		// encoding/json turns it into U+FFFD: "m\ud800" and "m\udbff" would become one
		// message id (the second a duplicate, never run) and one chat id two chats' key.
		return nil, badRequest(CodeInvalidUTF8, fmt.Sprintf(
			"the body holds %s, half of a UTF-16 surrogate pair, which is no character; send the pair or the character itself", esc))
	}
	if aerr := req.validate(); aerr != nil {
		return nil, aerr
	}
	if req.MessageID == "" {
		req.MessageID = newMessageID()
	}
	return &platforms.Inbound{
		Source: identity.Source{
			Platform: Name,
			ChatType: req.ChatType,
			ChatID:   req.ChatID,
			ThreadID: req.ThreadID,
			UserID:   req.UserID,
			UserName: req.UserName,
			Profile:  identity.CanonicalProfile(req.Profile),
		},
		MessageID:  req.MessageID,
		Text:       req.Text,
		ReceivedAt: time.Now(),
		StrictID:   true, // the client chose the id (or agentgate made a new one)
	}, nil
}

// checkContentEncoding refuses a body in a content coding other than identity (gzip, br…),
// which agentgate does not decode: read as it is, a compressed body is no UTF-8 (a misleading
// invalid_utf8), and a plain one labelled gzip would be taken as what its sender said it is
// not. RFC 9110 answers such a body 415, with Accept-Encoding naming the codings taken.
func checkContentEncoding(w http.ResponseWriter, r *http.Request) *apiError {
	for _, v := range r.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				w.Header().Set("Accept-Encoding", "identity")
				return &apiError{http.StatusUnsupportedMediaType, CodeUnsupportedCoding,
					fmt.Sprintf("the body must not be compressed: Content-Encoding %.40q is not supported; send it as it is, without Content-Encoding", c)}
			}
		}
	}
	return nil
}

// loneSurrogate finds the first \u escape of a UTF-16 surrogate that is not half of a
// high-low pair, in a body that decoded as JSON (where a backslash occurs only in strings).
func loneSurrogate(body []byte) (string, bool) {
	hex4 := func(i int) (rune, bool) {
		if i+4 > len(body) {
			return 0, false
		}
		v, err := strconv.ParseUint(string(body[i:i+4]), 16, 16)
		return rune(v), err == nil
	}
	for i := 0; i+1 < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		if body[i+1] != 'u' {
			i++ // \\, \" and the like: the escaped byte is no escape's start
			continue
		}
		r, ok := hex4(i + 2)
		switch {
		case !ok:
			i++
		case r >= 0xD800 && r < 0xDC00:
			if i+12 <= len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
				if lo, ok := hex4(i + 8); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 11
					continue
				}
			}
			return string(body[i : i+6]), true
		case r >= 0xDC00 && r <= 0xDFFF:
			return string(body[i : i+6]), true
		default:
			i += 5
		}
	}
	return "", false
}

// parseMessageRequest decodes exactly one JSON object with only known fields.
func parseMessageRequest(body []byte) (*MessageRequest, *apiError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest(CodeInvalidJSON, "the body is empty")
	}
	if bytes.HasPrefix(body, []byte("\ufeff")) {
		// As some Windows tools save a file: encoding/json would call it an invalid 'ï'.
		return nil, badRequest(CodeInvalidJSON, "the body begins with a byte order mark (U+FEFF), which JSON does not take (RFC 8259); send it without")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var req MessageRequest
	if err := dec.Decode(&req); err != nil {
		return nil, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, badRequest(CodeInvalidJSON, "unexpected data after the JSON object")
	}
	if aerr := checkFieldNames(body); aerr != nil {
		return nil, aerr
	}
	return &req, nil
}

// messageFields are the names of MessageRequest's fields, exactly as the API spells them.
var messageFields = func() map[string]bool {
	names := map[string]bool{}
	t := reflect.TypeFor[MessageRequest]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		names[name] = true
	}
	return names
}()

// checkFieldNames refuses what encoding/json lets through in a body that decoded: a null body
// (it decodes into the empty request), a field named in another case ("Chat_ID", which it
// takes for chat_id) and a field given twice (it keeps the last). Either of the last two
// leaves the chat, the sender or the text to whichever of two values a reader picks, and a
// proxy in front may have checked the other one.
func checkFieldNames(body []byte) *apiError {
	dec := json.NewDecoder(bytes.NewReader(body))
	t, err := dec.Token()
	if err != nil {
		return nil // cannot happen: the body decoded
	}
	if t != json.Delim('{') {
		// null, the one value besides an object that decodes into the request: it is no
		// more an object than [] is, and "chat_id, user_id and text are required" would
		// send its client looking for fields in a body that has none.
		return badRequest(CodeInvalidJSON, "the body must be a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil // cannot happen: the body decoded
		}
		name, _ := t.(string)
		if !messageFields[name] {
			return badRequest(CodeUnknownField, fmt.Sprintf("unknown field %.100q (field names are lower case: chat_id, user_id, text…)", name))
		}
		if seen[name] {
			return badRequest(CodeInvalidJSON, fmt.Sprintf("field %q is given twice", name))
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

func jsonError(err error) *apiError {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return badRequest(CodeInvalidField, fmt.Sprintf("%s must be a string", typeErr.Field))
	case errors.As(err, &typeErr):
		return badRequest(CodeInvalidJSON, "the body must be a JSON object")
	case strings.Contains(err.Error(), "unknown field"):
		// encoding/json has no typed error for DisallowUnknownFields; its message names the
		// field, quoted in full. It is quoted again cut short, as checkFieldNames does: a
		// name of 300,000 characters would otherwise come back whole in the answer.
		_, quoted, _ := strings.Cut(err.Error(), "unknown field ")
		name, uerr := strconv.Unquote(quoted)
		if uerr != nil {
			name = quoted
		}
		return badRequest(CodeUnknownField, fmt.Sprintf("unknown field %.100q", name))
	case errors.As(err, &syntaxErr):
		// Where, and what: a client cannot find its stray comma or shell-quoted quote in a
		// body of kilobytes otherwise. The error quotes at most one character of the body.
		return badRequest(CodeInvalidJSON, fmt.Sprintf("the body is not valid JSON: %s (byte %d)", syntaxErr, syntaxErr.Offset))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest(CodeInvalidJSON, "the body is not valid JSON: it ends before its JSON object does")
	default:
		return badRequest(CodeInvalidJSON, "the body is not valid JSON")
	}
}

// validate checks required fields, sizes and ids, and fills in the default chat type. It
// reports every problem in one answer, so that a client learns of all its missing or bad
// fields at once, not one per try; the status and code are those of the first problem, in
// the order below (so a body with one problem is answered as before). A text over the limit
// is the exception: it is answered 413 with its size and the limit alone, as a body over
// MaxBodyBytes is, whatever else the body holds; its other problems are told once it fits. A
// 413 is what a client acts on by sending less (a program splits the text): a 400 for an
// oversized text (when a field was missing too), or a 413 whose message went on about other
// fields, mixed two answers in one.
func (m *MessageRequest) validate() *apiError {
	if n := storedLen(m.Text); n > MaxTextBytes {
		msg := fmt.Sprintf("text is %d bytes, the limit is %d", n, MaxTextBytes)
		if n != len(m.Text) {
			msg = fmt.Sprintf("text is %d bytes as stored (each NUL is stored as U+FFFD, 3 bytes), the limit is %d", n, MaxTextBytes)
		}
		return &apiError{http.StatusRequestEntityTooLarge, CodeTextTooLarge, msg}
	}
	var problems []*apiError
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"chat_id", m.ChatID}, {"user_id", m.UserID}, {"text", m.Text},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	switch len(missing) {
	case 0:
	case 1:
		problems = append(problems, badRequest(CodeMissingField, missing[0]+" is required"))
	default:
		last := len(missing) - 1
		problems = append(problems, badRequest(CodeMissingField,
			strings.Join(missing[:last], ", ")+" and "+missing[last]+" are required"))
	}
	if m.Text != "" && strings.TrimSpace(m.Text) == "" {
		// The agent would get nothing to answer.
		problems = append(problems, badRequest(CodeMissingField, "text is blank"))
	}
	if m.ChatType == "" {
		m.ChatType = identity.ChatDM
	}
	if !identity.ValidChatType(m.ChatType) {
		problems = append(problems, badRequest(CodeInvalidChatType, "chat_type must be dm, group, channel or thread"))
	}
	if m.ChatType == identity.ChatThread && m.ThreadID == "" {
		problems = append(problems, badRequest(CodeMissingField, "thread_id is required when chat_type is thread"))
	}
	for _, f := range []struct{ name, v string }{
		{"chat_id", m.ChatID}, {"thread_id", m.ThreadID}, {"user_id", m.UserID},
		{"message_id", m.MessageID}, {"profile", m.Profile},
	} {
		if aerr := checkID(f.name, f.v, MaxIDBytes); aerr != nil {
			problems = append(problems, aerr)
		} else if i := invisibleAt(f.v); i >= 0 {
			r, _ := utf8.DecodeRuneInString(f.v[i:])
			problems = append(problems, badRequest(CodeInvalidField, fmt.Sprintf("%s contains the invisible format character %U", f.name, r)))
		}
	}
	if len(m.UserName) > MaxNameBytes {
		problems = append(problems, badRequest(CodeInvalidField, fmt.Sprintf("user_name is longer than %d bytes", MaxNameBytes)))
	}
	if len(problems) == 0 {
		return nil
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.message
	}
	return &apiError{status: problems[0].status, code: problems[0].code, message: strings.Join(msgs, "; ")}
}

// storedLen is the length of text as the store keeps it: the intake replaces each NUL, which
// PostgreSQL cannot store, by U+FFFD (3 bytes). The limit is of that, the text's rows, prompts
// and transcript pages: 64 KiB of NULs passed a check of the text as sent and were stored as
// 192 KiB.
func storedLen(text string) int {
	return len(text) + (len("\uFFFD")-1)*strings.Count(text, "\x00")
}

// checkID rejects an id that is too long, carries control characters or is padded (or made) with
// white space: ids end up in keys, logs and environment variables, where such characters only
// do harm.
func checkID(name, v string, maxLen int) *apiError {
	if len(v) > maxLen {
		return badRequest(CodeInvalidField, fmt.Sprintf("%s is longer than %d bytes", name, maxLen))
	}
	if strings.ContainsFunc(v, unicode.IsControl) {
		return badRequest(CodeInvalidField, name+" contains control characters")
	}
	if strings.TrimSpace(v) != v {
		// "u1" and "u1 " would be two users, or two chats, that no log line tells apart.
		return badRequest(CodeInvalidField, name+" begins or ends with white space")
	}
	return nil
}

// invisibleAt returns the index of the first invisible format character (Unicode category Cf)
// in id, or -1. In an id, a zero-width space, a soft hyphen or a byte order mark (which text
// copied from a page or a document may carry) makes a chat or a user that looks like the one
// meant but is another, as white space around an id does (checkID); a bidirectional override
// makes an id read otherwise than it is written; a tag character hides text. Taken are those
// that text needs: the zero-width joiner and non-joiner of emoji sequences and some scripts
// (which identity.NeutraliseName keeps in names too), the direction marks of right-to-left
// names (U+200E, U+200F, U+061C), and the tags of a subdivision flag (🏴 England: U+1F3F4,
// tags, then the cancel tag U+E007F). Only a new message's ids are checked: an id stored
// before may still be named (a requeue's, a listing's after).
func invisibleAt(id string) int {
	flag := false // within a flag's tag sequence
	for i, r := range id {
		switch {
		case r == '\U0001F3F4':
			flag = true
			continue
		case r >= '\U000E0020' && r <= '\U000E007F' && flag:
			flag = r != '\U000E007F'
			continue
		case r < 0x80, r == '\u200c', r == '\u200d', r == '\u200e', r == '\u200f', r == '\u061c':
		case unicode.Is(unicode.Cf, r):
			return i
		}
		flag = false
	}
	return -1
}

func newMessageID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it panics instead)
	return "http-" + hex.EncodeToString(b[:])
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// waiter collects the outbound messages that answer one waited-for message.
type waiter struct {
	chatID string
	msgID  string
	wake   chan struct{} // capacity 1: a pending wake-up is never lost, Send never blocks

	mu  sync.Mutex
	got []*platforms.Outbound
}

func (p *Platform) addWaiter(chatID, msgID string) *waiter {
	w := &waiter{chatID: chatID, msgID: msgID, wake: make(chan struct{}, 1)}
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.waiters[msgID]
	if set == nil {
		set = make(map[*waiter]struct{})
		p.waiters[msgID] = set
	}
	set[w] = struct{}{}
	return w
}

func (p *Platform) removeWaiter(w *waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := p.waiters[w.msgID]
	delete(set, w)
	if len(set) == 0 {
		delete(p.waiters, w.msgID)
	}
}

// offer is called by Send with p.mu held, and with what the outbox holds (offerDurable). An
// outbound addressed to another chat is not for this waiter even if a message id collides; the
// session key is checked once it is known. One it holds already (by key and seq) is not added
// again.
func (w *waiter) offer(out *platforms.Outbound) {
	if out.Target.ChatID != "" && out.Target.ChatID != w.chatID {
		return
	}
	w.mu.Lock()
	if !slices.ContainsFunc(w.got, func(o *platforms.Outbound) bool { return o.SessionKey == out.SessionKey && o.Seq == out.Seq }) {
		w.got = append(w.got, out)
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// result returns the outbounds of session key up to and including the first turn end, by seq
// without duplicates, and whether that turn end has arrived.
func (w *waiter) result(key string) ([]*platforms.Outbound, bool) {
	w.mu.Lock()
	got := slices.Clone(w.got)
	w.mu.Unlock()
	return answer(got, key, false)
}

// answer returns the outbounds of session key in got up to and including its first turn end
// (its last, with last), by seq without duplicates, and whether there is one.
func answer(got []*platforms.Outbound, key string, last bool) ([]*platforms.Outbound, bool) {
	got = slices.DeleteFunc(got, func(o *platforms.Outbound) bool { return o.SessionKey != key })
	slices.SortStableFunc(got, func(a, b *platforms.Outbound) int { return cmp.Compare(a.Seq, b.Seq) })
	got = slices.CompactFunc(got, func(a, b *platforms.Outbound) bool { return a.Seq == b.Seq })
	end := -1
	for i, o := range got {
		if o.TurnEnd {
			end = i
			if !last {
				break
			}
		}
	}
	if end < 0 {
		return nil, false
	}
	return got[:end+1], true
}

// awaitReplies blocks until the turn that handles the waited-for message ends, the deadline
// passes, the client goes away or the platform stops. A duplicate is first answered from the
// durable outbox: its turn may have ended long ago. With check, on a cluster member, the
// outbox is also read every ReplyCheck: the answer may have been sent on another member, whose
// relay missed this one. Those reads take only the entries after ack.OutboxAfter (the key's
// outbox seq before the message was taken), so a long chat's outbox is not read whole every
// ReplyCheck, and a requeued message's quarantine notice is not taken for its new answer.
//
// A duplicate whose outbox could not be read (the database unavailable, a single daemon's
// writes waiting in the spool) reads it again every ReplyCheck, whole, on any daemon: its turn
// may have ended before, and no live reply would come. Before, such a wait ran to its deadline
// and was answered 202 without the replies, also once the database answered again within it.
func (p *Platform) awaitReplies(ctx context.Context, stop <-chan struct{}, w *waiter, ack *platforms.Ack, deadline time.Time, check bool) ([]*platforms.Outbound, bool) {
	// The outbox's reads end with the wait (its deadline, the platform's stop): a database that
	// does not answer held the request until the store gave up (15 s on PostgreSQL), however
	// short the wait, and the stop with it.
	ctx, cancelDeadline := context.WithDeadline(ctx, deadline)
	defer cancelDeadline()
	ctx, cancel := cancelAtStop(ctx, stop)
	defer cancel()
	lookAfter, relook := ack.OutboxAfter, check && p.relayed.Load()
	if ack.Disposition == platforms.Duplicate {
		got, done, err := p.offerDurable(ctx, w, ack.SessionKey, 0, slog.LevelWarn)
		if done {
			return got, true
		}
		if err != nil {
			lookAfter, relook = 0, true
		}
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var look <-chan time.Time
	if relook && p.cfg.Sessions != nil {
		t := time.NewTicker(p.cfg.ReplyCheck)
		defer t.Stop()
		look = t.C
	}
	for {
		if got, done := w.result(ack.SessionKey); done {
			return got, true
		}
		select {
		case <-w.wake:
		case <-look:
			// A failed read is tried at the next check (and the relay may still come).
			if got, done, _ := p.offerDurable(ctx, w, ack.SessionKey, lookAfter, slog.LevelDebug); done {
				return got, true
			}
		case <-timer.C:
			return nil, false
		case <-ctx.Done():
			return nil, false
		case <-stop:
			return nil, false
		}
	}
}

// offerDurable reads what the outbox holds of the answer to w's message in session key. Once
// it holds the answer's end (an entry that is not Continued; an automatic reset's notice is
// durable as the message is taken, and its turn's reply follows), it returns the answer up to
// its last end: a message answered twice (quarantined, then requeued and run) is answered
// with both. Otherwise it offers w what there is, to be completed live (by seq, once). Only
// entries with a seq greater than after count. A failed read is logged at level, and returned.
func (p *Platform) offerDurable(ctx context.Context, w *waiter, key string, after int64, level slog.Level) ([]*platforms.Outbound, bool, error) {
	if p.cfg.Sessions == nil {
		return nil, false, nil
	}
	durable, err := p.cfg.Sessions.RepliesTo(ctx, key, w.msgID, after)
	if err != nil {
		if ctx.Err() == nil {
			p.log.Log(ctx, level, "load the replies to a message", "session", key, "message_id", w.msgID, logging.Err(err))
		}
		return nil, false, err
	}
	if got, done := answer(slices.Clone(durable), key, true); done {
		return got, true, nil
	}
	for _, o := range durable {
		w.offer(o)
	}
	return nil, false, nil
}

// eventKind maps an outbound kind to its SSE event name and reply kind.
func eventKind(kind string) string {
	if kind == platforms.KindNotice {
		return platforms.KindNotice
	}
	return platforms.KindReply
}

// parseSeq parses a non-negative outbox sequence number.
func parseSeq(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("parse seq %q: not a non-negative integer", s)
	}
	return n, nil
}

// query parses the request's query string. url.URL.Query drops a malformed pair (a bad
// escape, a semicolon) without a word, so a client's typo would silently change the request:
// it is a 400 invalid_query instead. So is a parameter given twice (?limit=5&limit=500):
// no route takes a list, and reading one of the two would be a guess. So is a parameter
// given with no value (?limit=, ?wait): its client meant something by it, and reading it as
// absent would guess the default. And so is a parameter the route does not take (takes lists
// those it does): a misspelt one (?wiat=30s) would otherwise be ignored without a word, and
// the request do something else than asked (not wait), as a misspelt body field is refused.
// The parameters are looked at in sorted order, so that the same request is always refused
// for the same one (a map's order changes from run to run).
func query(r *http.Request, takes ...string) (url.Values, *apiError) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, badRequest(CodeInvalidQuery, "the query string is malformed: "+err.Error())
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		vs := q[name]
		switch {
		case !slices.Contains(takes, name):
			what := "none"
			if len(takes) > 0 {
				what = strings.Join(takes, ", ")
			}
			return nil, badRequest(CodeInvalidQuery, fmt.Sprintf("the query parameter %.100q is not one this route takes (it takes %s)", name, what))
		case len(vs) > 1:
			return nil, badRequest(CodeInvalidQuery, fmt.Sprintf("the query parameter %q is given %d times; give it once", name, len(vs)))
		case vs[0] == "":
			return nil, badRequest(CodeInvalidQuery, fmt.Sprintf("the query parameter %q has no value; give it one, or leave it out", name))
		}
	}
	return q, nil
}
