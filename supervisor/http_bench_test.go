package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/agentgate/agentgate/internal/identity"
	"github.com/agentgate/agentgate/persistence/workload"
	"github.com/agentgate/agentgate/platforms"
)

// BenchmarkHTTPIngress measures POST /v1/messages on the real HTTP platform over loopback, the
// 202 path: decode and validate the body, build the key, ask the session, wait until the message
// is durable (one SQLite commit, synchronous FULL), answer 202. The echo agent then answers each
// message in the background, so the writer also carries the turns' result and delivery writes,
// as in production. Messages go round-robin to 64 chats.
//
// clients=1 alternates blocks of 64 POSTs with blocks of 64 direct calls of the intake's Deliver
// (no HTTP, other chats), so that both see the same background; ns/op is the mean of both. It
// reports http_p50_us, direct_p50_us and http_added_us (their difference: what the HTTP layer
// and the JSON cost). Alternating request by request would not do: each request would then wait
// for the other path's background writes. clients=16 keeps
// 16 requests in flight and reports req/s (ns/op is wall time per request) and the p50 and p99
// of a request.
func BenchmarkHTTPIngress(b *testing.B) {
	const chats = 64
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			bd := mustStartBenchDaemon(b, "", "bench", nil)
			defer bd.stop(b)
			c := &ingressClient{
				url:    "http://" + bd.d.Addr().String() + "/v1/messages",
				client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: time.Minute},
			}
			defer c.client.CloseIdleConnections()
			if clients == 1 {
				var viaHTTP, direct []time.Duration
				for i := 0; b.Loop(); i++ {
					if (i/chats)%2 == 0 {
						d, err := c.post(fmt.Sprint("h-", i%chats), fmt.Sprint("h", i))
						if err != nil {
							b.Fatal(err)
						}
						viaHTTP = append(viaHTTP, d)
						continue
					}
					src := identity.Source{Platform: "http", ChatType: identity.ChatDM, ChatID: fmt.Sprint("d-", i%chats), UserID: "u"}
					start := time.Now()
					if _, err := bd.d.intake.Deliver(context.Background(), &platforms.Inbound{
						Source: src, MessageID: fmt.Sprint("d", i), Text: ingressText, ReceivedAt: start}); err != nil {
						b.Fatalf("Deliver: %v", err)
					}
					direct = append(direct, time.Since(start))
				}
				b.ReportMetric(workload.QuantileUS(viaHTTP, 0.50), "http_p50_us")
				b.ReportMetric(workload.QuantileUS(direct, 0.50), "direct_p50_us")
				b.ReportMetric(workload.QuantileUS(viaHTTP, 0.50)-workload.QuantileUS(direct, 0.50), "http_added_us")
				return
			}
			work := make(chan int)
			lat := make([][]time.Duration, clients)
			errs := make([]error, clients)
			var wg sync.WaitGroup
			for w := range clients {
				wg.Go(func() {
					for i := range work {
						d, err := c.post(fmt.Sprint("h-", i%chats), fmt.Sprint("h", i))
						if err != nil {
							errs[w] = err
							for range work { // drain, so the benchmark loop never blocks
							}
							return
						}
						lat[w] = append(lat[w], d)
					}
				})
			}
			start := time.Now()
			n := 0
			for b.Loop() {
				work <- n
				n++
			}
			close(work)
			wg.Wait()
			elapsed := time.Since(start)
			var all []time.Duration
			for w := range clients {
				if errs[w] != nil {
					b.Fatal(errs[w])
				}
				all = append(all, lat[w]...)
			}
			b.ReportMetric(float64(n)/elapsed.Seconds(), "req/s")
			b.ReportMetric(workload.QuantileUS(all, 0.50), "p50_us")
			b.ReportMetric(workload.QuantileUS(all, 0.99), "p99_us")
		})
	}
}

// ingressText is the text of every benchmark message (300 bytes, like the workload's).
var ingressText = string(bytes.Repeat([]byte("lorem ipsum "), 25))

type ingressClient struct {
	url    string
	client *http.Client
}

// post sends one message and returns how long the 202 took.
func (c *ingressClient) post(chat, id string) (time.Duration, error) {
	body, err := json.Marshal(map[string]string{"chat_id": chat, "user_id": "u", "message_id": id, "text": ingressText})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	resp, err := c.client.Post(c.url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("POST %s: %w", id, err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("POST %s: read body: %w", id, err)
	}
	if resp.StatusCode != http.StatusAccepted {
		return 0, fmt.Errorf("POST %s: status %s, want 202 Accepted", id, resp.Status)
	}
	return took, nil
}
