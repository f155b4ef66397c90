// Package buildinfo says which build of agentgate is running: `agentgate version` prints it,
// and the daemon's start line carries it, so a log read at 3 a.m. names the build it came from.
package buildinfo

import "runtime/debug"

// Version is the module version, the first 12 digits of the commit it was built from (when
// the build recorded one) and the Go version: "(devel) 0123456789ab go1.26.8".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v + " " + bi.GoVersion
}
