package config

import (
	"maps"
	"slices"
	"sync"
	"time"
	// The daily reset hour may name any IANA zone, and a zone that validates on one machine
	// must resolve on every other: the database is embedded for machines (slim containers)
	// that have none. A system copy still wins where there is one.
	_ "time/tzdata"
)

// chatTypes are the chat types (DESIGN §3) that sessions.reset_by_type may name.
var chatTypes = []string{"dm", "group", "channel", "thread"}

// resetModes are the values of sessions.reset.mode.
var resetModes = []string{"none", "idle", "daily", "both"}

// ResetFor returns the reset policy of a session on platform in a chat of type chatType: each
// field comes from sessions.reset_by_platform[platform] when set there, else from
// sessions.reset_by_type[chatType], else from sessions.reset. Notify is false on a platform
// listed in sessions.reset.quiet_platforms. The result shares nothing with c.
func (c *Config) ResetFor(platform, chatType string) Reset {
	s := &c.Sessions
	r := s.Reset
	r.QuietPlatforms = slices.Clone(r.QuietPlatforms)
	if o, ok := s.ResetByType[chatType]; ok {
		o.apply(&r)
	}
	if o, ok := s.ResetByPlatform[platform]; ok {
		o.apply(&r)
	}
	if slices.Contains(r.QuietPlatforms, platform) {
		r.Notify = false
	}
	return r
}

// ResetPolicies returns every distinct policy that ResetFor can return, the default's first
// and the rest in a stable order. The reset timer scans the store once per policy.
func (c *Config) ResetPolicies() []Reset {
	s := &c.Sessions
	// "" stands for every platform the config doesn't name.
	platforms := append([]string{""}, slices.Sorted(maps.Keys(s.ResetByPlatform))...)
	platforms = append(platforms, s.Reset.QuietPlatforms...)
	// "" stands for a chat type without an override, so the default comes first.
	types := append([]string{""}, chatTypes...)
	type key struct {
		mode, tz            string
		idle, hour          int
		notify              bool
		checkEvery, minIdle time.Duration
	}
	seen := make(map[key]bool)
	var out []Reset
	for _, p := range platforms {
		for _, t := range types {
			r := c.ResetFor(p, t)
			k := key{r.Mode, r.Timezone, r.IdleMinutes, r.AtHour, r.Notify, r.CheckEvery, r.DailyMinIdle}
			if !seen[k] {
				seen[k] = true
				out = append(out, r)
			}
		}
	}
	return out
}

// apply sets the fields of r that o sets.
func (o ResetOverride) apply(r *Reset) {
	if o.Mode != nil {
		r.Mode = *o.Mode
	}
	if o.IdleMinutes != nil {
		r.IdleMinutes = *o.IdleMinutes
	}
	if o.AtHour != nil {
		r.AtHour = *o.AtHour
	}
	if o.Notify != nil {
		r.Notify = *o.Notify
	}
	if o.DailyMinIdle != nil {
		r.DailyMinIdle = *o.DailyMinIdle
	}
}

// Idle returns idle_minutes as a duration.
func (r Reset) Idle() time.Duration { return time.Duration(r.IdleMinutes) * time.Minute }

// Location returns the time zone that AtHour is read in: Timezone, or time.Local when Timezone
// is empty or names no zone (which Validate reports). It never returns nil.
func (r Reset) Location() *time.Location {
	if r.Timezone == "" {
		return time.Local
	}
	loc, err := loadLocation(r.Timezone)
	if err != nil {
		return time.Local
	}
	return loc
}

// locations caches loaded zones: time.LoadLocation reads and parses a file on every call, and
// the reset timer asks on every scan.
var locations sync.Map // string → *time.Location

func loadLocation(name string) (*time.Location, error) {
	if loc, ok := locations.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	locations.Store(name, loc)
	return loc, nil
}
