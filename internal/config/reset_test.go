package config

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestResetFor(t *testing.T) {
	base := Reset{Mode: "daily", IdleMinutes: 1440, AtHour: 4, Timezone: "UTC", Notify: true,
		QuietPlatforms: []string{"http"}, CheckEvery: time.Minute}
	byPlatform := map[string]ResetOverride{
		"discord": {Mode: new("idle"), IdleMinutes: new(30)},
		"matrix":  {},
		"irc":     {Notify: new(false)},
		"slack":   {DailyMinIdle: new(30 * time.Minute)},
	}
	byType := map[string]ResetOverride{
		"dm":     {Mode: new("none"), AtHour: new(6), Notify: new(false)},
		"thread": {IdleMinutes: new(60), Mode: new("both")},
	}
	tests := []struct {
		name               string
		platform, chatType string
		byPlatform, byType map[string]ResetOverride
		want               func(*Reset)
	}{
		{"no overrides at all", "discord", "dm", nil, nil, func(*Reset) {}},
		{"no matching override", "telegram", "group", byPlatform, byType, func(*Reset) {}},
		{"chat type only", "telegram", "dm", byPlatform, byType, func(r *Reset) {
			r.Mode, r.AtHour, r.Notify = "none", 6, false
		}},
		{"platform only", "discord", "group", byPlatform, byType, func(r *Reset) {
			r.Mode, r.IdleMinutes = "idle", 30
		}},
		{"platform beats type field by field", "discord", "dm", byPlatform, byType, func(r *Reset) {
			// mode and idle_minutes from discord; at_hour and notify from dm.
			r.Mode, r.IdleMinutes, r.AtHour, r.Notify = "idle", 30, 6, false
		}},
		{"platform beats type on the same field", "discord", "thread", byPlatform, byType, func(r *Reset) {
			r.Mode, r.IdleMinutes = "idle", 30
		}},
		{"empty platform override inherits everything", "matrix", "thread", byPlatform, byType, func(r *Reset) {
			r.Mode, r.IdleMinutes = "both", 60
		}},
		{"platform override turns notify off", "irc", "group", byPlatform, byType, func(r *Reset) { r.Notify = false }},
		{"platform override defers the daily reset", "slack", "dm", byPlatform, byType, func(r *Reset) {
			r.Mode, r.AtHour, r.Notify, r.DailyMinIdle = "none", 6, false, 30*time.Minute
		}},
		{"quiet platform never notifies", "http", "group", byPlatform, byType, func(r *Reset) { r.Notify = false }},
		{"quiet platform beats a type's notify", "http", "dm", byPlatform,
			map[string]ResetOverride{"dm": {Notify: new(true)}}, func(r *Reset) { r.Notify = false }},
		{"unknown chat type is the default", "telegram", "forum", byPlatform, byType, func(*Reset) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Sessions.Reset = base
			c.Sessions.Reset.QuietPlatforms = []string{"http"}
			c.Sessions.ResetByPlatform = tt.byPlatform
			c.Sessions.ResetByType = tt.byType
			if err := c.Validate(); err != nil {
				t.Fatalf("test config does not validate: %v", err)
			}
			want := base
			want.QuietPlatforms = []string{"http"}
			tt.want(&want)
			got := c.ResetFor(tt.platform, tt.chatType)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("ResetFor(%q, %q) mismatch (-want +got):\n%s", tt.platform, tt.chatType, diff)
			}
			got.QuietPlatforms[0] = "changed"
			if c.Sessions.Reset.QuietPlatforms[0] != "http" {
				t.Errorf("ResetFor(%q, %q) shares quiet_platforms with the config", tt.platform, tt.chatType)
			}
		})
	}
}

func TestResetForDefault(t *testing.T) {
	got := Default().ResetFor("http", "dm")
	want := Reset{Mode: "none", IdleMinutes: 1440, AtHour: 4, Notify: true, CheckEvery: time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Default().ResetFor mismatch (-want +got):\n%s", diff)
	}
	if got.Location() != time.Local {
		t.Errorf("Default().ResetFor().Location() = %v, want time.Local", got.Location())
	}
	if got, want := got.Idle(), 24*time.Hour; got != want {
		t.Errorf("Idle() = %v, want %v", got, want)
	}
}

func TestResetPolicies(t *testing.T) {
	type policy struct {
		Mode   string
		Idle   int
		Notify bool
	}
	tests := []struct {
		name       string
		quiet      []string
		byPlatform map[string]ResetOverride
		byType     map[string]ResetOverride
		want       []policy
	}{
		{"default only", nil, nil, nil, []policy{{"none", 1440, true}}},
		{"overrides equal to the default collapse", nil,
			map[string]ResetOverride{"discord": {Mode: new("none")}},
			map[string]ResetOverride{"dm": {}}, []policy{{"none", 1440, true}}},
		{"each distinct combination once", []string{"http"},
			map[string]ResetOverride{"discord": {Mode: new("idle")}},
			map[string]ResetOverride{"dm": {IdleMinutes: new(60)}, "group": {IdleMinutes: new(60)}},
			[]policy{
				{"none", 1440, true}, {"none", 60, true},
				{"idle", 1440, true}, {"idle", 60, true},
				{"none", 1440, false}, {"none", 60, false},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Sessions.Reset.QuietPlatforms = tt.quiet
			c.Sessions.ResetByPlatform = tt.byPlatform
			c.Sessions.ResetByType = tt.byType
			var got []policy
			for _, r := range c.ResetPolicies() {
				got = append(got, policy{r.Mode, r.IdleMinutes, r.Notify})
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ResetPolicies() mismatch (-want +got):\n%s", diff)
			}
			// Every policy ResetFor can give is in the list.
			for _, p := range []string{"", "discord", "http", "other"} {
				for _, ct := range append([]string{"forum"}, chatTypes...) {
					r := c.ResetFor(p, ct)
					if !slices.Contains(got, policy{r.Mode, r.IdleMinutes, r.Notify}) {
						t.Errorf("ResetFor(%q, %q) = %+v, missing from ResetPolicies()", p, ct, r)
					}
				}
			}
		})
	}
}

func TestResetLocation(t *testing.T) {
	tests := []struct {
		timezone string
		want     string
	}{
		{"", time.Local.String()},
		{"Local", time.Local.String()},
		{"UTC", "UTC"},
		{"America/New_York", "America/New_York"},
		{"Europe/Atlantis", time.Local.String()}, // invalid: Validate reports it
	}
	for _, tt := range tests {
		t.Run(tt.timezone, func(t *testing.T) {
			loc := Reset{Timezone: tt.timezone}.Location()
			if loc == nil {
				t.Fatalf("Reset{Timezone: %q}.Location() = nil", tt.timezone)
			}
			if got := loc.String(); got != tt.want {
				t.Errorf("Reset{Timezone: %q}.Location() = %q, want %q", tt.timezone, got, tt.want)
			}
		})
	}
	// The daily hour is read in the zone: 04:00 in New York is 09:00 UTC in winter.
	loc := Reset{Timezone: "America/New_York"}.Location()
	if got := time.Date(2026, 1, 10, 4, 0, 0, 0, loc).UTC().Hour(); got != 9 {
		t.Errorf("04:00 America/New_York = %02d:00 UTC, want 09:00", got)
	}
	if a, b := (Reset{Timezone: "Asia/Tokyo"}).Location(), (Reset{Timezone: "Asia/Tokyo"}).Location(); a != b {
		t.Errorf("Location() loaded Asia/Tokyo twice (%p, %p), want the cached zone", a, b)
	}
}
