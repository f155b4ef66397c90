package supervisor

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/agentgate/agentgate/internal/config"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// clusterTLS returns the remote options that make the members talk mutual TLS 1.3: every member
// presents its certificate, and a connection, either way, is accepted only when the peer's
// certificate chains to the cluster's CA. Members dial each other by address, so a member's
// certificate need not name it: being signed by the cluster's CA is what makes a member (the
// certificate is used as server and client, so it needs both extended key usages, or none).
// No files, no options: plain gRPC, for a private network.
func clusterTLS(t config.ClusterTLS) ([]remote.ConfigOption, error) {
	if t.CertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster.tls: load %s and %s: %w", t.CertFile, t.KeyFile, err)
	}
	caPEM, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("cluster.tls.ca_file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("cluster.tls.ca_file: %s holds no PEM certificate", t.CAFile)
	}
	server := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    roots,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	client := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// The standard verification would also require the certificate to name the address
		// dialled; the chain is verified below instead, against the cluster's CA only.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("cluster member presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if err != nil {
				return fmt.Errorf("cluster member's certificate: %w", err)
			}
			return nil
		},
	}
	return []remote.ConfigOption{
		remote.WithServerOptions(grpc.Creds(credentials.NewTLS(server))),
		remote.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(client))),
	}, nil
}
