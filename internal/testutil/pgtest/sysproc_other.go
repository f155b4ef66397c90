//go:build !linux

package pgtest

import (
	"errors"
	"syscall"
)

// sysProcAttr returns the process attributes to run initdb or postgres as cred (nil: as the
// current user). Outside Linux it cannot switch user, so running the tests as root fails, and
// a killed test binary may leave its server running.
func sysProcAttr(cred *credential, server bool) (*syscall.SysProcAttr, error) {
	if cred != nil {
		return nil, errors.New("running as root: pgtest can run postgres as another user only on linux")
	}
	return nil, nil
}
