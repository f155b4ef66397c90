package spool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agentgate/agentgate/persistence"
)

// formatVersion is the version of the batch file format written by EncodeOps.
const formatVersion = 1

// file is the JSON document of one batch file.
type file struct {
	Version   int          `json:"version"`
	CreatedAt time.Time    `json:"created_at"`
	Groups    [][]taggedOp `json:"groups"`
}

// taggedOp is one Op with the name of its concrete type.
type taggedOp struct {
	Type string          `json:"type"`
	Op   json.RawMessage `json:"op"`
}

// EncodeOps encodes groups of writes as a batch file stamped with the current time. Every op
// must be a non-nil pointer to one of the concrete Op types of package persistence; anything
// else is an error, so that a write is never spooled in a form that cannot be replayed.
func EncodeOps(groups [][]persistence.Op) ([]byte, error) {
	return encode(groups, time.Now())
}

func encode(groups [][]persistence.Op, createdAt time.Time) ([]byte, error) {
	f := file{Version: formatVersion, CreatedAt: createdAt, Groups: make([][]taggedOp, len(groups))}
	for i, g := range groups {
		f.Groups[i] = make([]taggedOp, len(g))
		for j, op := range g {
			typ, body, err := encodeOp(op)
			if err != nil {
				return nil, fmt.Errorf("encode ops: group %d op %d: %w", i, j, err)
			}
			f.Groups[i][j] = taggedOp{Type: typ, Op: body}
		}
	}
	data, err := json.Marshal(&f)
	if err != nil {
		return nil, fmt.Errorf("encode ops: %w", err)
	}
	return data, nil
}

// encodeOp returns the type tag and JSON of one op. A nil pointer is rejected: it would decode
// as a zero-valued op, which is not what was written.
func encodeOp(op persistence.Op) (string, []byte, error) {
	var (
		typ   string
		isNil bool
	)
	switch o := op.(type) {
	case *persistence.CreateSession:
		typ, isNil = "CreateSession", o == nil
	case *persistence.EndSession:
		typ, isNil = "EndSession", o == nil
	case *persistence.ReopenSession:
		typ, isNil = "ReopenSession", o == nil
	case *persistence.TouchSession:
		typ, isNil = "TouchSession", o == nil
	case *persistence.SetTitle:
		typ, isNil = "SetTitle", o == nil
	case *persistence.SetQueueMode:
		typ, isNil = "SetQueueMode", o == nil
	case *persistence.AppendMessage:
		typ, isNil = "AppendMessage", o == nil
	case *persistence.SetMessageStatus:
		typ, isNil = "SetMessageStatus", o == nil
	case *persistence.IncrementAttempts:
		typ, isNil = "IncrementAttempts", o == nil
	case *persistence.SetAttempts:
		typ, isNil = "SetAttempts", o == nil
	case *persistence.MarkProbation:
		typ, isNil = "MarkProbation", o == nil
	case *persistence.MarkResetDue:
		typ, isNil = "MarkResetDue", o == nil
	case *persistence.ArchiveMessages:
		typ, isNil = "ArchiveMessages", o == nil
	case *persistence.RequeueMessage:
		typ, isNil = "RequeueMessage", o == nil
	case *persistence.PutRoute:
		typ, isNil = "PutRoute", o == nil
	case *persistence.AddOutbox:
		typ, isNil = "AddOutbox", o == nil
	case *persistence.MarkDelivery:
		typ, isNil = "MarkDelivery", o == nil
	case *persistence.AddUsage:
		typ, isNil = "AddUsage", o == nil
	case *persistence.OpenDraft:
		typ, isNil = "OpenDraft", o == nil
	case *persistence.CloseDraft:
		typ, isNil = "CloseDraft", o == nil
	case *persistence.MarkUnread:
		typ, isNil = "MarkUnread", o == nil
	case *persistence.ClearUnread:
		typ, isNil = "ClearUnread", o == nil
	case *persistence.Fence:
		typ, isNil = "Fence", o == nil
	default:
		return "", nil, fmt.Errorf("unknown op type %T", op)
	}
	if isNil {
		return "", nil, fmt.Errorf("nil %s op", typ)
	}
	body, err := json.Marshal(op)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", typ, err)
	}
	return typ, body, nil
}

// newOp returns a pointer to a zero value of the Op type named typ, or nil for an unknown name.
func newOp(typ string) persistence.Op {
	switch typ {
	case "CreateSession":
		return &persistence.CreateSession{}
	case "EndSession":
		return &persistence.EndSession{}
	case "ReopenSession":
		return &persistence.ReopenSession{}
	case "TouchSession":
		return &persistence.TouchSession{}
	case "SetTitle":
		return &persistence.SetTitle{}
	case "SetQueueMode":
		return &persistence.SetQueueMode{}
	case "AppendMessage":
		return &persistence.AppendMessage{}
	case "SetMessageStatus":
		return &persistence.SetMessageStatus{}
	case "IncrementAttempts":
		return &persistence.IncrementAttempts{}
	case "SetAttempts":
		return &persistence.SetAttempts{}
	case "MarkProbation":
		return &persistence.MarkProbation{}
	case "MarkResetDue":
		return &persistence.MarkResetDue{}
	case "ArchiveMessages":
		return &persistence.ArchiveMessages{}
	case "RequeueMessage":
		return &persistence.RequeueMessage{}
	case "PutRoute":
		return &persistence.PutRoute{}
	case "AddOutbox":
		return &persistence.AddOutbox{}
	case "MarkDelivery":
		return &persistence.MarkDelivery{}
	case "AddUsage":
		return &persistence.AddUsage{}
	case "OpenDraft":
		return &persistence.OpenDraft{}
	case "CloseDraft":
		return &persistence.CloseDraft{}
	case "MarkUnread":
		return &persistence.MarkUnread{}
	case "ClearUnread":
		return &persistence.ClearUnread{}
	case "Fence":
		return &persistence.Fence{}
	}
	return nil
}

// DecodeOps decodes a batch file written by EncodeOps and returns its groups (pointers to the
// concrete Op types) and its creation time. Anything but a complete, version 1 document of known
// op types and fields is an error.
func DecodeOps(data []byte) ([][]persistence.Op, time.Time, error) {
	var f file
	if err := decodeStrict(data, &f); err != nil {
		return nil, time.Time{}, fmt.Errorf("decode ops: %w", err)
	}
	if f.Version != formatVersion {
		return nil, time.Time{}, fmt.Errorf("decode ops: unsupported version %d", f.Version)
	}
	groups := make([][]persistence.Op, len(f.Groups))
	for i, g := range f.Groups {
		groups[i] = make([]persistence.Op, len(g))
		for j, t := range g {
			op := newOp(t.Type)
			if op == nil {
				return nil, time.Time{}, fmt.Errorf("decode ops: group %d op %d: unknown op type %q", i, j, t.Type)
			}
			if len(t.Op) == 0 || bytes.Equal(t.Op, []byte("null")) {
				return nil, time.Time{}, fmt.Errorf("decode ops: group %d op %d: %s without body", i, j, t.Type)
			}
			if err := decodeStrict(t.Op, op); err != nil {
				return nil, time.Time{}, fmt.Errorf("decode ops: group %d op %d: %s: %w", i, j, t.Type, err)
			}
			groups[i][j] = op
		}
	}
	return groups, f.CreatedAt, nil
}

// decodeStrict unmarshals exactly one JSON value with no unknown fields and nothing after it.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the document")
	}
	return nil
}
