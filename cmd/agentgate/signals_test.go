package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// TestAwaitSecondSignal: which stop signal during a drain exits at once, without a cluster.
// In a stop a signal began, the next SIGINT or SIGTERM does; in one the daemon began on its
// own (Fatal: a top-level actor stopped, a cluster member that lost its membership), the first
// one lets the drain go on and only the next one does. A SIGHUP never does (a terminal that
// drops sends two), but it is a stop signal as it is when it begins the stop: in a stop the
// daemon began on its own, the SIGINT or SIGTERM after it exits, as its line says ("a second
// SIGINT or SIGTERM exits at once") and RUNBOOK's row with it. Before, that one was taken for
// the first stop signal and only told the drain goes on (a review).
func TestAwaitSecondSignal(t *testing.T) {
	hup, term, intr := syscall.SIGHUP, syscall.SIGTERM, os.Interrupt
	tests := []struct {
		name      string
		signalled bool
		sigs      []os.Signal
		exitAfter int // how many of sigs come before it returns; 0: it does not
		logs      []string
	}{
		{"signalled: the next SIGTERM exits", true, []os.Signal{term}, 1, []string{"second signal; exiting now"}},
		{"signalled: hangups do not", true, []os.Signal{hup, hup}, 0, []string{"hangup received (SIGHUP) during the drain"}},
		{"signalled: SIGINT after hangups", true, []os.Signal{hup, hup, intr}, 3, []string{"second signal; exiting now"}},
		{"on its own: the first SIGTERM does not", false, []os.Signal{term}, 0,
			[]string{"signal received while the daemon stops on its own; the drain goes on"}},
		{"on its own: the second SIGTERM exits", false, []os.Signal{term, term}, 2, []string{"second signal; exiting now"}},
		{"on its own: hangups do not", false, []os.Signal{hup, hup}, 0, []string{"hangup received (SIGHUP) during the drain"}},
		{"on its own: the SIGTERM after a hangup exits", false, []os.Signal{hup, term}, 2, []string{"second signal; exiting now"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs bytes.Buffer
				log := slog.New(slog.NewTextHandler(&logs, nil))
				sigs := make(chan os.Signal)
				returned := make(chan struct{})
				go func() {
					defer close(returned)
					if !awaitSecondSignal(sigs, tt.signalled, &exitGate{}, log) {
						t.Errorf("awaitSecondSignal = false before the stop ended, want true (exit)")
					}
				}()
				for i, sig := range tt.sigs {
					if t.Failed() {
						break
					}
					sigs <- sig
					synctest.Wait()
					select {
					case <-returned:
						if i+1 != tt.exitAfter {
							t.Errorf("returned at signal %d (%v) of %v, want at %d (0: never):\n%s", i+1, sig, tt.sigs, tt.exitAfter, logs.String())
						}
					default:
						if i+1 == tt.exitAfter {
							t.Errorf("did not return at signal %d (%v) of %v:\n%s", i+1, sig, tt.sigs, logs.String())
						}
					}
				}
				for _, want := range tt.logs {
					if !strings.Contains(logs.String(), want) {
						t.Errorf("log = %s\nwant a line with %q", logs.String(), want)
					}
				}
				for { // the bubble ends with the goroutine: SIGTERMs end it
					select {
					case sigs <- term:
					case <-returned:
						return
					}
				}
			})
		})
	}
}

// TestAwaitStopFatalWins: what begins the stop, and whether serve exits non-zero for it. A
// fatal error (a top-level actor stopped, a cluster member that lost its membership) that is
// there with a stop signal wins: serve exits 1, and a service manager restarts the daemon that
// failed. Before, the select took either, and when it took the signal the daemon exited 0 (a
// review); both are ready before it runs here, many times over, so that it meets both orders.
func TestAwaitStopFatalWins(t *testing.T) {
	lost := errors.New("cluster membership lost")
	tests := []struct {
		name          string
		sig           os.Signal // sent before the wait; nil: none
		fatal         error     // reported before the wait; nil: none
		cancelled     bool      // ctx ended before the wait
		wantFatal     error
		wantSignalled bool
	}{
		{"a signal", syscall.SIGTERM, nil, false, nil, true},
		{"a fatal error", nil, lost, false, lost, false},
		{"ctx ended", nil, nil, true, nil, false},
		{"a fatal error with ctx's end", nil, lost, true, lost, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			sigs, fatals := make(chan os.Signal, 1), make(chan error, 1)
			if tt.sig != nil {
				sigs <- tt.sig
			}
			if tt.fatal != nil {
				fatals <- tt.fatal
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancelled {
				cancel()
			}
			fatal, signalled := awaitStop(ctx, sigs, fatals, 30*time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
			if fatal != tt.wantFatal || signalled != tt.wantSignalled {
				t.Errorf("awaitStop = %v, signalled %v; want %v, signalled %v\n%s", fatal, signalled, tt.wantFatal, tt.wantSignalled, logs.String())
			}
		})
	}
	t.Run("a signal and a fatal error at once", func(t *testing.T) {
		for i := range 200 {
			var logs bytes.Buffer
			sigs, fatals := make(chan os.Signal, 1), make(chan error, 1)
			sigs <- syscall.SIGTERM
			fatals <- lost
			fatal, _ := awaitStop(context.Background(), sigs, fatals, 30*time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
			if fatal != lost {
				t.Fatalf("try %d: awaitStop = %v, want %v: serve would exit 0 for a daemon that failed\n%s", i+1, fatal, lost, logs.String())
			}
			if want := `msg=stopping reason="cluster membership lost"`; !strings.Contains(logs.String(), want) {
				t.Fatalf("try %d: log = %s\nwant a line with %s", i+1, logs.String(), want)
			}
		}
	})
}

// TestSignalAfterTheStopEnded: a second stop signal that comes once the stop ended (in the
// instant before serve stops taking signals, or one left in the channel) does not exit 2: the
// stop's own exit status stands, 0 after a clean stop. Before, it was the "second signal;
// exiting now" of a drain that was over, and a clean stop exited 2 (a review).
func TestSignalAfterTheStopEnded(t *testing.T) {
	hup, term, intr := syscall.SIGHUP, syscall.SIGTERM, os.Interrupt
	tests := []struct {
		name      string
		signalled bool
		sigs      []os.Signal
	}{
		{"signalled: the next SIGTERM", true, []os.Signal{term}},
		{"signalled: SIGINT after a hangup", true, []os.Signal{hup, intr}},
		{"on its own: the second SIGTERM", false, []os.Signal{term, term}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs bytes.Buffer
				log := slog.New(slog.NewTextHandler(&logs, nil))
				sigs := make(chan os.Signal)
				var exit exitGate
				exited := make(chan bool, 1)
				go func() { exited <- awaitSecondSignal(sigs, tt.signalled, &exit, log) }()
				synctest.Wait() // it waits for a signal, as serve's goroutine does through the stop
				exit.end()
				for _, sig := range tt.sigs {
					sigs <- sig
				}
				if got := <-exited; got {
					t.Errorf("awaitSecondSignal = true after the stop ended, want false: a clean stop would exit 2\n%s", logs.String())
				}
				if strings.Contains(logs.String(), "second signal; exiting now") {
					t.Errorf("log = %s\nwant no \"second signal; exiting now\" after the stop ended", logs.String())
				}
			})
		})
	}
}

// TestStopResult: serve's result once the stop ended, which sets its exit status. A fatal
// error the daemon reports during the drain a signal began (a cluster member that lost its
// membership in a database outage, a top-level actor stopped) makes it exit 1 with that error,
// as one that began the stop does. Before, nothing read it after the signal: the stop exited 0,
// and a service manager took a daemon that had failed for one that stopped cleanly (a review).
func TestStopResult(t *testing.T) {
	lost := errors.New("cluster membership lost")
	stuck := errors.New("close the store: stuck")
	tests := []struct {
		name        string
		stopErr     error
		fatal       error // the one that began the stop
		duringDrain error // reported during the drain
		want        error
	}{
		{"a clean stop a signal began", nil, nil, nil, nil},
		{"a fatal error began the stop", nil, lost, nil, lost},
		{"a fatal error during the drain a signal began", nil, nil, lost, lost},
		{"the stop's own error first", stuck, nil, lost, stuck},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fatals := make(chan error, 1)
			if tt.duringDrain != nil {
				fatals <- tt.duringDrain
			}
			if got := stopResult(tt.stopErr, tt.fatal, fatals); got != tt.want {
				t.Errorf("stopResult(%v, %v) with %v reported during the drain = %v, want %v", tt.stopErr, tt.fatal, tt.duringDrain, got, tt.want)
			}
		})
	}
}
