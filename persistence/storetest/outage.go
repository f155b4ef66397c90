package storetest

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/agentgate/agentgate/persistence"
)

// Outage is a store whose commits fail, while Down is set, as a database that cannot be
// written does (persistence.ErrUnavailable: disk full, locked); its reads go on.
type Outage struct {
	persistence.Store
	Down atomic.Bool
}

// Commit commits through the wrapped store, or fails every group while Down is set.
func (o *Outage) Commit(ctx context.Context, groups [][]persistence.Op) []error {
	if !o.Down.Load() {
		return o.Store.Commit(ctx, groups)
	}
	errs := make([]error, len(groups))
	for i := range errs {
		errs[i] = fmt.Errorf("%w: disk full (test)", persistence.ErrUnavailable)
	}
	return errs
}
