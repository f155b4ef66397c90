package actors

import (
	"runtime"
	"testing"
	"weak"
)

// TestDequeueReleasesItems checks that a session which took the last items out of its queue
// (to run them) no longer holds them: an idle session must not keep its last message alive.
func TestDequeueReleasesItems(t *testing.T) {
	s := &Session{}
	first, second := &item{seq: 1, text: "first"}, &item{seq: 2, text: "second"}
	s.queue = append(s.queue, first, second)
	w := weak.Make(first)
	first = nil

	s.dequeue(1)
	if len(s.queue) != 1 || s.queue[0] != second {
		t.Fatalf("after dequeue(1) the queue holds %d items, want the second one", len(s.queue))
	}
	s.dequeue(1)
	if len(s.queue) != 0 {
		t.Fatalf("after dequeue(1) again the queue holds %d items, want none", len(s.queue))
	}
	runtime.GC()
	if w.Value() != nil {
		t.Error("the session still holds an item it took out of its queue")
	}
	runtime.KeepAlive(s) // the session is alive and idle: only its own fields may hold the item
	runtime.KeepAlive(second)
}
