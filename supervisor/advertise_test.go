package supervisor

import (
	"net"
	"strings"
	"testing"
)

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestAdvertiseMustReachTheBind: an advertised address of this host that does not reach
// cluster.bind stops the start with an error that names both. Before, the member joined and
// stayed ready while the others could send it nothing (found by an audit).
func TestAdvertiseMustReachTheBind(t *testing.T) {
	bind := freeAddr(t)
	if err := checkAdvertise(bind, bind); err != nil {
		t.Errorf("advertise = bind: %v, want it taken", err)
	}
	nobody := freeAddr(t)
	if err := checkAdvertise(bind, nobody); err == nil || !strings.Contains(err.Error(), "cluster.advertise "+nobody+" does not reach this member's cluster.bind "+bind) {
		t.Errorf("advertise where nothing listens: %v, want it refused, naming both", err)
	}
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := checkAdvertise(bind, other.Addr().String()); err == nil || !strings.Contains(err.Error(), "reaches another process") {
		t.Errorf("advertise where another process listens: %v, want it refused", err)
	}
	// Not this host's address (behind NAT): not checked, it may not route back from here.
	if err := checkAdvertise(bind, "192.0.2.1:6340"); err != nil {
		t.Errorf("advertise of another host: %v, want it taken unchecked", err)
	}
}
