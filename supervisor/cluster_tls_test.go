//go:build !race

package supervisor

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/agentgate/agentgate/internal/testutil/pgtest"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, dir: t.TempDir()}
	writePEM(t, filepath.Join(ca.dir, "ca.pem"), "CERTIFICATE", der)
	return ca
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// member issues a member certificate (for no particular address) and returns its files.
func (ca *testCA) member(t *testing.T, name string) config.ClusterTLS {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	files := config.ClusterTLS{CertFile: filepath.Join(ca.dir, name+".pem"), KeyFile: filepath.Join(ca.dir, name+"-key.pem"),
		CAFile: filepath.Join(ca.dir, "ca.pem")}
	writePEM(t, files.CertFile, "CERTIFICATE", der)
	writePEM(t, files.KeyFile, "EC PRIVATE KEY", keyDER)
	return files
}

// TestClusterMutualTLS: with cluster.tls the members talk mutual TLS (a session on the other
// member answers through it), and the cluster port refuses a client whose certificate another
// CA signed, and one without a certificate.
func TestClusterMutualTLS(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ca := newTestCA(t, "agentgate cluster CA")
	var rs []*runtime
	for i := range 2 {
		files := ca.member(t, fmt.Sprint("member-", i))
		rs = append(rs, MustStartDaemon(t, okAgent, daemonOpts{tweak: func(c *config.Config) {
			c.Store.Driver, c.Store.DSN = "postgres", dsn
			c.Cluster.Enabled, c.Cluster.Bind, c.Cluster.MemberTTL = true, "127.0.0.1:0", 2*time.Second
			c.Cluster.TLS = files
		}}))
	}
	defer stopAll(t, rs)
	waitUntil(t, func() bool {
		return len(rs[0].d.cluster.MemberList.Members().Members()) == 2 && len(rs[1].d.cluster.MemberList.Members().Members()) == 2
	})
	remote := 0
	for i := 0; remote == 0; i++ {
		if i == 50 {
			t.Fatal("no session of 50 ran on the other member")
		}
		body := fmt.Sprintf(`{"chat_id":"tls%d","user_id":"u","text":"hi %d"}`, i, i)
		resp, err := http.Post("http://"+rs[0].d.Addr().String()+"/v1/messages?wait=20s", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat tls%d: status %d, want 200 with the reply", i, resp.StatusCode)
		}
		own, err := rs[0].d.store.Ownership(t.Context(), "agent:main:http:dm:tls"+fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		if own.Owner != rs[0].d.deps.Node {
			remote++
		}
	}

	addr := rs[1].d.system.Address()
	stranger := newTestCA(t, "another CA").member(t, "stranger")
	cert, err := tls.LoadX509KeyPair(stranger.CertFile, stranger.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, certs := range map[string][]tls.Certificate{"a certificate of another CA": {cert}, "no certificate": nil} {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, Certificates: certs, NextProtos: []string{"h2"}})
		if err == nil {
			// TLS 1.3 reports a refused client certificate on the first read.
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("a client with %s: %v, want the handshake refused for its certificate", name, err)
		}
	}
}
