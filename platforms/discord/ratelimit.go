package discord

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
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
// it first.

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
			return err
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
			return err
		}
		if err := discordgo.Unmarshal(resp, v); err != nil {
			return fmt.Errorf("%w: %s", discordgo.ErrJSONUnmarshal, err)
		}
		return nil
	}
}

// noteRateLimit remembers until when Discord refuses requests in bucket, or in every bucket
// when the limit is global.
func (p *Platform) noteRateLimit(bucket string, rl *discordgo.RateLimit, global bool) {
	until := time.Now().Add(max(rl.RetryAfter, minRateLimitWait))
	// A bot that sends too much meets a 429 at every few calls: one line a minute says so.
	if n, ok := p.rateWarn.Allow(); ok {
		p.log.Warn("discord rate limit", "url", rl.URL, "retry_after", rl.RetryAfter, "global", global, "limits", n)
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
