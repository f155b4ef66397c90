package discordtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/bwmarrin/discordgo"
)

// Client returns an *http.Client for discordgo.Session.Client that sends every request
// under discordgo.EndpointAPI to APIURL instead. It refuses requests to any other host, and
// dials only loopback addresses.
func (s *Server) Client() *http.Client {
	return &http.Client{
		Transport: &rewriter{api: s.apiURL, host: strings.TrimPrefix(s.http.URL, "http://"), next: s.transport},
		Timeout:   20 * time.Second,
	}
}

// rewriter is the RoundTripper of Server.Client.
type rewriter struct {
	api  string // Server.APIURL
	host string // 127.0.0.1:PORT
	next http.RoundTripper
}

func (rt *rewriter) RoundTrip(req *http.Request) (*http.Response, error) {
	if rest, ok := strings.CutPrefix(req.URL.String(), discordgo.EndpointAPI); ok {
		u, err := url.Parse(rt.api + rest)
		if err != nil {
			closeBody(req)
			return nil, fmt.Errorf("discordtest: rewrite %s: %w", req.URL, err)
		}
		out := req.Clone(req.Context())
		out.URL = u
		out.Host = ""
		return rt.next.RoundTrip(out)
	}
	if req.URL.Host == rt.host {
		return rt.next.RoundTrip(req)
	}
	closeBody(req)
	return nil, fmt.Errorf("discordtest: refusing request to %s: only %s is served", req.URL, rt.api)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// dialLoopback dials like net.Dialer but only to loopback IP addresses.
func dialLoopback(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("discordtest: refusing to dial %s: not a loopback address", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
