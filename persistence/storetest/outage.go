package storetest

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/agentgate/agentgate/persistence"
)

// Outage is a store whose commits fail, while Down is set, as a database that cannot be
// written does (persistence.ErrUnavailable: disk full, locked); its reads go on. While Lost is
// above zero, each commit instead applies and then fails (counting Lost down), as a COMMIT
// whose answer a broken connection lost does: the caller cannot tell it applied.
type Outage struct {
	persistence.Store
	Down atomic.Bool
	Lost atomic.Int32
}

// Wrap makes o the outage of s: what a test world's writes take to wrap its store
// (func(persistence.Store) persistence.Store).
func (o *Outage) Wrap(s persistence.Store) persistence.Store {
	o.Store = s
	return o
}

// Commit commits through the wrapped store, or fails every group while Down is set; a commit
// whose answer is lost (Lost) applies and fails every group that applied.
func (o *Outage) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if o.loseAnswer() {
		errs := o.Store.Commit(ctx, groups)
		for i, err := range errs {
			if err == nil {
				errs[i] = fmt.Errorf("%w: connection lost after COMMIT (test)", persistence.ErrUnavailable)
			}
		}
		return errs
	}
	if !o.Down.Load() {
		return o.Store.Commit(ctx, groups)
	}
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
	}
	return errs
}

// loseAnswer takes one from Lost, if it is above zero, and reports whether it did.
func (o *Outage) loseAnswer() bool {
	for {
		n := o.Lost.Load()
		if n <= 0 {
			return false
		}
		if o.Lost.CompareAndSwap(n, n-1) {
			return true
		}
	}
}
