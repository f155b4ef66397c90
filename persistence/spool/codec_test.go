package spool

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/agentgate/agentgate/persistence"
)

var (
	cest = time.FixedZone("CEST", 2*60*60)
	t0   = time.Date(2025, 6, 1, 12, 30, 45, 123456789, time.UTC)
)

// opSamples returns one value of every concrete persistence.Op type, with every field set, so
// that a round trip exercises every field. TestEveryOpTypeHasSample keeps it complete.
func opSamples() []persistence.Op {
	session := persistence.Session{
		ID: "s-1", Key: "agent:main:http:dm:c1", Platform: "http", ChatType: "dm", ChatID: "c1",
		ThreadID: "t1", UserID: "u1", UserName: "Ünïcode \"name\"\n", ScopeID: "g1", Profile: "main",
		StartedAt: t0, LastActivityAt: t0.Add(time.Nanosecond).In(cest), EndedAt: t0.Add(time.Hour),
		EndReason: persistence.EndCrash, PrevSessionID: "s-0", Title: "title", Epoch: 7, QueueMode: "steer",
		InputTokens: 1200, OutputTokens: 340, ResetDueReason: persistence.EndDaily, ResetDueAt: t0.Add(30 * time.Minute),
	}
	message := persistence.Message{
		SessionID: "s-1", Seq: 3, Role: persistence.RoleUser, Content: "hello\x00 <world> & \u2028",
		Platform: "http", ChatID: "c1", MessageID: "m1", UserID: "u1", UserName: "Ann",
		TurnID: "turn-1", Status: persistence.StatusPending, Active: true, Archived: true, Attempts: 2,
		CreatedAt: t0.In(cest),
	}
	return []persistence.Op{
		&persistence.CreateSession{Session: session},
		&persistence.EndSession{SessionID: "s-1", Reason: persistence.EndNewCommand, At: t0.Add(999)},
		&persistence.ReopenSession{SessionID: "s-1"},
		&persistence.TouchSession{SessionID: "s-1", At: t0.Add(1)},
		&persistence.SetTitle{SessionID: "s-1", Title: "a title"},
		&persistence.SetQueueMode{SessionID: "s-1", Mode: "collect"},
		&persistence.AppendMessage{Message: message},
		&persistence.SetMessageStatus{SessionID: "s-1", Seqs: []int64{1, 2, 1 << 62}, Status: persistence.StatusDone, TurnID: "turn-2"},
		&persistence.IncrementAttempts{SessionID: "s-1", Seqs: []int64{4}},
		&persistence.SetAttempts{SessionID: "s-1", Seq: 4, Attempts: 3},
		&persistence.MarkProbation{SessionID: "s-1", Seq: 4, Run: "r-1"},
		&persistence.MarkResetDue{SessionID: "s-1", Reason: persistence.EndDaily, At: t0.Add(3)},
		&persistence.RequeueMessage{SessionID: "s-1", Seq: 4, NewSeq: 9},
		&persistence.ArchiveMessages{SessionID: "s-1", Seqs: []int64{5, 6}},
		&persistence.PutRoute{Route: persistence.Route{Key: "k", SessionID: "s-1", Generation: 9, UpdatedAt: t0}},
		&persistence.AddOutbox{Entry: persistence.OutboxEntry{
			SessionKey: "k", Seq: 11, SessionID: "s-1", Kind: "reply", Text: "hi", TurnID: "turn-1",
			InReplyTo: []string{"m1", "m2"}, Platform: "http", ChatType: "dm", ChatID: "c1",
			ThreadID: "t1", UserID: "u1", State: persistence.DeliveryPending, Attempts: 1,
			CreatedAt: t0, DeliveredAt: t0.Add(time.Second).In(cest), Continued: true,
		}},
		&persistence.MarkDelivery{SessionKey: "k", Seq: 11, State: persistence.DeliveryDelivered, At: t0.Add(2), Attempt: 3},
		&persistence.AddUsage{SessionID: "s-1", TurnID: "turn-1", InputTokens: 812, OutputTokens: 96},
		&persistence.OpenDraft{Draft: persistence.Draft{Platform: "discord", ID: "1300", SessionKey: "k",
			TurnID: "turn-1", ChatType: "thread", ChatID: "c", ThreadID: "th", Run: "r_1", CreatedAt: t0.Add(3)}},
		&persistence.CloseDraft{Platform: "discord", ID: "1300"},
		&persistence.MarkUnread{Unread: persistence.Unread{Platform: "discord", ChatID: "c", ScopeID: "g", After: "1299", At: t0.Add(4)}},
		&persistence.ClearUnread{Platform: "discord", ChatID: "c", After: "1299"},
		&persistence.Fence{Key: "k", Epoch: 1 << 40},
	}
}

func opName(op persistence.Op) string {
	return reflect.TypeOf(op).Elem().Name()
}

// MustAllFieldsSet fails the test if any field of v (recursively through structs) is the zero
// value, so that a field added to an Op is covered by the round trip before it ships.
func MustAllFieldsSet(t *testing.T, path string, v reflect.Value) {
	t.Helper()
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Type() == reflect.TypeFor[time.Time]() || v.Kind() != reflect.Struct {
		if v.IsZero() {
			t.Errorf("sample %s is the zero value; set it so the round trip covers it", path)
		}
		return
	}
	for i := range v.NumField() {
		MustAllFieldsSet(t, path+"."+v.Type().Field(i).Name, v.Field(i))
	}
}

func TestEveryOpTypeHasSample(t *testing.T) {
	// The Op types are the receivers of isOp in package persistence; read them from its source.
	files, err := filepath.Glob(filepath.Join("..", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "isOp" || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
			if !ok {
				t.Fatalf("%s: isOp has a value receiver; ops must be pointers", fset.Position(fn.Pos()))
			}
			want = append(want, star.X.(*ast.Ident).Name)
		}
	}
	var got []string
	for _, op := range opSamples() {
		got = append(got, opName(op))
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(want) == 0 {
		t.Fatal("found no isOp methods in package persistence")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("opSamples() types differ from the Op types of package persistence (-want +got):\n%s\n"+
			"add a sample here and a case to encodeOp and newOp", diff)
	}
}

func TestCodecRoundTrip(t *testing.T) {
	for _, op := range opSamples() {
		t.Run(opName(op), func(t *testing.T) {
			MustAllFieldsSet(t, opName(op), reflect.ValueOf(op))
			want := [][]persistence.Op{{op}}
			data, err := EncodeOps(want)
			if err != nil {
				t.Fatalf("EncodeOps(%s) error: %v", opName(op), err)
			}
			got, _, err := DecodeOps(data)
			if err != nil {
				t.Fatalf("DecodeOps(%s) error: %v", data, err)
			}
			// cmp compares time.Time with its Equal method: the instant, not the location.
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("DecodeOps(EncodeOps(%s)) mismatch (-want +got):\n%s", opName(op), diff)
			}
			if got[0][0] == op {
				t.Errorf("DecodeOps returned the encoded pointer itself, want a fresh value")
			}
		})
	}
}

func TestCodecRoundTripBatch(t *testing.T) {
	ops := opSamples()
	want := [][]persistence.Op{
		ops[:4],
		{}, // an empty group stays an empty group
		ops[4:],
		{
			&persistence.SetMessageStatus{SessionID: "nil seqs"},
			&persistence.ArchiveMessages{SessionID: "empty seqs", Seqs: []int64{}},
			&persistence.EndSession{SessionID: "zero time"},
			&persistence.AddOutbox{Entry: persistence.OutboxEntry{InReplyTo: []string{}}},
		},
	}
	createdAt := t0.Add(42).In(cest)
	data, err := encode(want, createdAt)
	if err != nil {
		t.Fatalf("encode error: %v", err)
	}
	got, gotAt, err := DecodeOps(data)
	if err != nil {
		t.Fatalf("DecodeOps error: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DecodeOps(encode(batch)) mismatch (-want +got):\n%s", diff)
	}
	if !gotAt.Equal(createdAt) {
		t.Errorf("DecodeOps created_at = %v, want %v", gotAt, createdAt)
	}
	if end := got[3][2].(*persistence.EndSession); !end.At.IsZero() {
		t.Errorf("zero time decoded as %v, want the zero time", end.At)
	}
}

func TestEncodeOpsFormat(t *testing.T) {
	data, err := encode([][]persistence.Op{{&persistence.SetTitle{SessionID: "s", Title: "x"}}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"version":    1.0,
		"created_at": "2025-06-01T12:30:45.123456789Z",
		"groups": []any{[]any{map[string]any{
			"type": "SetTitle",
			"op":   map[string]any{"SessionID": "s", "Title": "x"},
		}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("encoded document mismatch (-want +got):\n%s", diff)
	}
}

// TestMarkDeliveryOfAnOlderBinaryDecodes: a MarkDelivery an older binary spooled has no
// Attempt (the field came later). It decodes, with Attempt zero, which the stores apply as such
// marks always were: one attempt more (storetest's DeliveryAttempts). A new mark keeps its
// number.
func TestMarkDeliveryOfAnOlderBinaryDecodes(t *testing.T) {
	const old = `{"version":1,"created_at":"2025-06-01T12:30:45Z","groups":[[` +
		`{"type":"MarkDelivery","op":{"SessionKey":"k","Seq":11,"State":"failed","At":"2025-06-01T12:30:46Z"}}]]}`
	groups, _, err := DecodeOps([]byte(old))
	if err != nil {
		t.Fatalf("DecodeOps(an older binary's MarkDelivery) error: %v", err)
	}
	want := [][]persistence.Op{{&persistence.MarkDelivery{SessionKey: "k", Seq: 11, State: persistence.DeliveryFailed,
		At: time.Date(2025, 6, 1, 12, 30, 46, 0, time.UTC)}}}
	if diff := cmp.Diff(want, groups); diff != "" {
		t.Errorf("DecodeOps(an older binary's MarkDelivery) mismatch (-want +got):\n%s", diff)
	}
	data, err := encode([][]persistence.Op{{&persistence.MarkDelivery{SessionKey: "k", Seq: 11, State: persistence.DeliveryFailed, Attempt: 2}}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"Attempt":2`) {
		t.Errorf("EncodeOps(MarkDelivery{Attempt: 2}) = %s, want it to hold \"Attempt\":2", data)
	}
}

func TestEncodeOpsErrors(t *testing.T) {
	tests := []struct {
		name   string
		groups [][]persistence.Op
		want   string
	}{
		{"nil op", [][]persistence.Op{{&persistence.SetTitle{}, nil}}, "group 0 op 1: unknown op type <nil>"},
		{"nil pointer", [][]persistence.Op{{}, {(*persistence.PutRoute)(nil)}}, "group 1 op 0: nil PutRoute op"},
		{"unmarshalable time", [][]persistence.Op{{&persistence.TouchSession{At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}}, "TouchSession"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := EncodeOps(tt.groups)
			if err == nil {
				t.Fatalf("EncodeOps = %s, want an error", data)
			}
			if !strings.HasPrefix(err.Error(), "encode ops: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("EncodeOps error = %q, want it to start with %q and contain %q", err, "encode ops: ", tt.want)
			}
		})
	}
}

func TestDecodeOpsErrors(t *testing.T) {
	const at = `"created_at":"2025-06-01T12:30:45Z"`
	tests := []struct {
		name string
		data string
		want string
	}{
		{"empty", ``, "unexpected EOF"},
		{"not json", `spool`, "invalid character"},
		{"truncated", `{"version":1,` + at + `,"groups":[[{"type":"SetTitle","op":{"SessionID":"s"`, "unexpected EOF"},
		{"trailing data", `{"version":1,` + at + `,"groups":[]} {}`, "trailing data"},
		{"missing version", `{` + at + `,"groups":[]}`, "unsupported version 0"},
		{"future version", `{"version":2,` + at + `,"groups":[]}`, "unsupported version 2"},
		{"unknown envelope field", `{"version":1,` + at + `,"groups":[],"extra":1}`, "unknown field"},
		{"unknown op type", `{"version":1,` + at + `,"groups":[[{"type":"DropTable","op":{}}]]}`, `unknown op type "DropTable"`},
		{"missing type", `{"version":1,` + at + `,"groups":[[{"op":{}}]]}`, `unknown op type ""`},
		{"missing op", `{"version":1,` + at + `,"groups":[[{"type":"SetTitle"}]]}`, "SetTitle without body"},
		{"null op", `{"version":1,` + at + `,"groups":[[{"type":"SetTitle","op":null}]]}`, "SetTitle without body"},
		{"unknown op field", `{"version":1,` + at + `,"groups":[[{"type":"SetTitle","op":{"Name":"x"}}]]}`, "unknown field"},
		{"wrong field type", `{"version":1,` + at + `,"groups":[[{"type":"IncrementAttempts","op":{"Seqs":"1"}}]]}`, "IncrementAttempts"},
		{"bad time", `{"version":1,"created_at":"yesterday","groups":[]}`, "cannot parse"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			groups, _, err := DecodeOps([]byte(tt.data))
			if err == nil {
				t.Fatalf("DecodeOps(%q) = %v, want an error", tt.data, groups)
			}
			if !strings.HasPrefix(err.Error(), "decode ops: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("DecodeOps(%q) error = %q, want it to start with %q and contain %q", tt.data, err, "decode ops: ", tt.want)
			}
		})
	}
}
