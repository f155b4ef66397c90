package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/discordgo"
)

// Rate limits. Every REST call of the platform goes through request: discordgo's request path
// (its bucket limiter, its retries of a 502, its errors) without discordgo's own handling of a
// 429, which sleeps whatever retry_after Discord asks (hours for a slowmode the bot may not
// bypass, or a long ban), deaf to the call's ctx, and then retries; whatever made the call
// waited that long: a chat's final reply and every reply queued behind it, the gateway's
// reader looking up a channel. Here a 429 is remembered until its retry_after ends, for the
// route's bucket, and a call to that bucket waits out what is remembered only while its ctx's
// deadline allows; otherwise it fails at once with an error that says so, and its caller tries
// again later (the platform actor, for a send). The bucket is the one discordgo keys the route
// by, so that by the time a call reaches discordgo's limiter, which would sleep until the
// bucket resets just as deafly, the reset has passed. A 429 whose body says "global": true
// holds every route of the bot, so it is remembered for every bucket, and every call honours
// it first. A 429 that is not Discord's own (its edge's block of the host: see blockedAs429) is
// made into a global one.

// minRateLimitWait is the least wait after a 429, so that one asking for none is not retried
// in a tight loop.
const minRateLimitWait = 50 * time.Millisecond

// maxRateLimited bounds the remembered rate limits; past ones are forgotten first.
const maxRateLimited = 1000

// request makes one REST call: method on url, body encoded as JSON (nil for none), in
// discordgo's bucket for the route, under the platform's rate-limit policy (see above). The
// response is decoded into v as discordgo decodes it; nil ignores it.
func (p *Platform) request(ctx context.Context, method, url, bucket string, body, v any) error {
	for {
		if err := p.waitRateLimit(ctx, bucket); err != nil {
			return &notSent{err: err}
		}
		var data []byte
		if body != nil {
			var err error
			if data, err = discordgo.Marshal(body); err != nil {
				return err
			}
		}
		// As discordgo's RequestWithBucketID, in a bucket of the platform's own limiter.
		resp, err := p.s.RequestWithLockedBucket(method, url, "application/json", data, p.buckets.lock(bucket), 0,
			discordgo.WithContext(ctx), discordgo.WithRetryOnRatelimit(false))
		var rl *discordgo.RateLimitError
		if errors.As(err, &rl) {
			// discordgo's RateLimit drops the body's "global", but returns the body.
			p.noteRateLimit(bucket, rl.RateLimit, isGlobal(resp))
			continue
		}
		if err != nil || v == nil {
			return p.sentTo(err)
		}
		if err := discordgo.Unmarshal(resp, v); err != nil {
			return fmt.Errorf("%w: %s", discordgo.ErrJSONUnmarshal, err)
		}
		return nil
	}
}

// notSent is the error of a REST call that Discord acted on in no way: it failed waiting out a
// rate limit, before its first request went out or after requests that Discord answered with a
// 429 only (request tries again after a 429 alone). A send tells by it that its post made no
// message (mayHavePosted).
type notSent struct{ err error }

func (e *notSent) Error() string { return e.err.Error() }
func (e *notSent) Unwrap() error { return e.err }

// noteRateLimit remembers until when Discord refuses requests in bucket, or in every bucket
// when the limit is global.
func (p *Platform) noteRateLimit(bucket string, rl *discordgo.RateLimit, global bool) {
	until := time.Now().Add(max(rl.RetryAfter, minRateLimitWait))
	// A bot that sends too much meets a 429 at every few calls: one line a minute says so. An
	// edge's block (blockedAs429) has a line a minute of its own: what to do about it differs,
	// and it came within a minute of a route's 429 as often as not (a bot that sends too much
	// is the one that meets both), whose line held it back.
	blocked := rl.TooManyRequests != nil && rl.Message == blockedMessage
	warn := &p.rateWarn
	if blocked {
		warn = &p.blockWarn
	}
	if n, ok := warn.Allow(); ok {
		attrs := []any{"url", p.api.to(rl.URL), "retry_after", rl.RetryAfter, "global", global, "limits", n}
		if blocked {
			attrs = append(attrs, "blocked", true) // Discord's edge refuses this host (blockedAs429)
		}
		p.log.Warn("discord rate limit", attrs...)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if global {
		if until.After(p.global) {
			p.global = until
		}
		return
	}
	if len(p.limited) >= maxRateLimited {
		now := time.Now()
		maps.DeleteFunc(p.limited, func(_ string, t time.Time) bool { return !t.After(now) })
	}
	if len(p.limited) < maxRateLimited && until.After(p.limited[bucket]) {
		p.limited[bucket] = until
	}
}

// waitRateLimit waits until Discord takes requests in bucket again, after a global limit too,
// or fails at once when ctx would end before that.
func (p *Platform) waitRateLimit(ctx context.Context, bucket string) error {
	p.mu.Lock()
	until, scope := p.limited[bucket], strings.TrimPrefix(bucket, discordgo.EndpointAPI)
	if p.global.After(until) {
		until, scope = p.global, "every route (global)"
	}
	p.mu.Unlock()
	return waitUntil(ctx, until, scope)
}

// waitUntil waits until until, or fails at once when ctx would end before that; scope names
// what is rate limited.
func waitUntil(ctx context.Context, until time.Time, scope string) error {
	wait := time.Until(until)
	if wait <= 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
		return fmt.Errorf("discord rate limit on %s: retry after %v, past the call's deadline", scope, wait.Round(time.Millisecond))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitGatewayLookup waits out a rate limit Open's gateway lookup got, within ctx. Open makes the
// one REST call the platform does not make itself (discordgo's GET gateway, until it has the
// URL); discordgo no longer sleeps through its 429 (ShouldRetryOnRateLimit is off), so Open
// fails, and the next Run waits here, where a stop ends the wait. A global limit is not waited
// for: Open makes no REST call once it knows the gateway's URL, and the gateway is not rate
// limited with REST; if it does make one, its 429 is waited for here the next time.
func (p *Platform) waitGatewayLookup(ctx context.Context) error {
	p.mu.Lock()
	until := p.limited[discordgo.EndpointGateway]
	p.mu.Unlock()
	return waitUntil(ctx, until, "the gateway lookup")
}

// maxBuckets is how many distinct buckets one generation of the platform's bucket limiter hands
// out before it is replaced by a fresh one (restBuckets).
var maxBuckets = 10_000

// restBuckets is discordgo's per-bucket limiter (the one that paces a route's requests within
// its window from the headers of every answer), renewed after maxBuckets distinct buckets.
// discordgo keeps a bucket for every key it was ever asked for, for the Session's lifetime, and
// most keys name a channel (a post, an edit, typing, a lookup, a backfill page) or a message (an
// auto-thread's opening): one limiter for the daemon's life held a bucket for every DM, thread
// and mention the bot ever answered, a few hundred bytes each, for months
// (TestRESTBucketsFollowTheActiveChannels). A renewal forgets what the old generation knew of the
// buckets still in use; their next request goes out at once and reads the limit again from its
// answer, and a 429 it may meet is handled as any other (request). Global limits are kept by
// the platform itself (Platform.global), not by the limiter.
type restBuckets struct {
	mu   sync.Mutex
	lim  *discordgo.RateLimiter
	keys map[string]struct{} // the keys lim has handed out
}

// lock locks the bucket of key in the current generation, as discordgo's LockBucket does
// (waiting for the bucket's window, deaf to any ctx, as before).
func (b *restBuckets) lock(key string) *discordgo.Bucket {
	b.mu.Lock()
	if _, ok := b.keys[key]; !ok {
		if b.lim == nil || len(b.keys) >= maxBuckets {
			b.lim, b.keys = discordgo.NewRatelimiter(), map[string]struct{}{}
		}
		b.keys[key] = struct{}{}
	}
	lim := b.lim
	b.mu.Unlock()
	return lim.LockBucket(key)
}

// isGlobal reports whether the body of a 429 says the limit is global.
func isGlobal(body []byte) bool {
	var b struct {
		Global bool `json:"global"`
	}
	return discordgo.Unmarshal(body, &b) == nil && b.Global
}

// Blocks. Discord's edge (Cloudflare) refuses a host that made too many invalid requests (401,
// 403 and 429 answers: 10,000 in 10 minutes) for a while, on every route, with a 429 that is not
// Discord's: an HTML page, or a JSON error without retry_after, with a Retry-After header at
// best. discordgo reads a 429's wait from its JSON body only: an HTML body failed the call with
// a JSON syntax error (logged at error by discordgo), which request returned as any other
// failure, and every caller tried again at once (the platform actor within a second, a backfill
// page within 250 ms, the typing indicator at its next tick), each try one more invalid request
// that kept the block on; a JSON body without retry_after was waited out for minRateLimitWait.
// blockedAs429 makes such an answer Discord's global 429, so that request holds every route
// until it ends: its wait is the Retry-After header's, or, without one, blockWaitFirst doubling
// up to blockWaitMax while such answers keep coming (any other answer starts it over).

// blockedMessage is the message of the 429 body blockedAs429 makes.
const blockedMessage = "blocked by Discord's edge (a 429 that is not Discord's own)"

// blockWaitFirst is the wait after a block's first 429 without a Retry-After header (a
// time.Duration; tests shorten it); blockWaitMax is the longest.
var blockWaitFirst atomic.Int64

const blockWaitMax = 10 * time.Minute

func init() { blockWaitFirst.Store(int64(10 * time.Second)) }

// maxBlockBody is as much of a 429's body as is read: Discord's own are a few dozen bytes, an
// edge's page a few KB. A longer body is taken for the edge's.
const maxBlockBody = 64 << 10

// blockedAs429 is the REST transport that rewrites a 429 that is not Discord's own into
// Discord's global 429 (see Blocks above).
type blockedAs429 struct {
	next http.RoundTripper

	mu    sync.Mutex
	wait  time.Duration // the next wait without a Retry-After; 0 is blockWaitFirst
	until time.Time     // when the last such wait ends
}

func (b *blockedAs429) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		if err == nil {
			b.mu.Lock()
			b.wait, b.until = 0, time.Time{} // the block, if there was one, is over
			b.mu.Unlock()
		}
		return resp, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBlockBody+1))
	resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read discord 429 body: %w", err)
	}
	if len(body) <= maxBlockBody && discordsOwn429(body) {
		resp.Body = io.NopCloser(bytes.NewReader(body))
		return resp, nil
	}
	wait, ok := retryAfter(resp.Header, time.Now())
	if !ok {
		wait = b.backoff(time.Now())
	}
	made, err := json.Marshal(map[string]any{"message": blockedMessage, "retry_after": wait.Seconds(), "global": true})
	if err != nil {
		return nil, fmt.Errorf("rewrite discord 429: %w", err)
	}
	resp.Header = resp.Header.Clone()
	resp.Header.Set("Content-Type", "application/json")
	resp.Header.Del("Content-Length")
	resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(made)), int64(len(made))
	return resp, nil
}

// backoff returns the wait after a 429 without Retry-After, and doubles the next one. The
// answers to requests that were out together (before the first one's wait began) share one
// wait, and double it once.
func (b *blockedAs429) backoff(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Before(b.until) {
		return b.until.Sub(now)
	}
	wait := b.wait
	if wait == 0 {
		wait = time.Duration(blockWaitFirst.Load())
	}
	b.wait, b.until = min(2*wait, blockWaitMax), now.Add(wait)
	return wait
}

// discordsOwn429 reports whether body is the JSON object of Discord's own 429, which says how
// long to wait (retry_after).
func discordsOwn429(body []byte) bool {
	var v struct {
		RetryAfter *float64 `json:"retry_after"`
	}
	return json.Unmarshal(body, &v) == nil && v.RetryAfter != nil
}

// maxRetryAfter bounds the wait a Retry-After header asks for (a garbled one would overflow).
const maxRetryAfter = 24 * time.Hour

// retryAfter is the wait a Retry-After header asks for (seconds, or an HTTP date), if it asks
// for one.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	var wait time.Duration
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		wait = time.Duration(min(s, maxRetryAfter.Seconds()) * float64(time.Second))
	} else if t, err := http.ParseTime(v); err == nil {
		wait = min(t.Sub(now), maxRetryAfter)
	}
	if wait <= 0 {
		return 0, false
	}
	return wait, true
}
