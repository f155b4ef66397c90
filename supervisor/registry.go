package supervisor

import cmap "github.com/orcaman/concurrent-map"

// protoactor's process registry (one per actor system) spreads the actors' ids over 1024
// concurrent maps, and each of those over cmap.SHARD_COUNT Go maps of its own: 32,768 maps with
// the library's default of 32. A Go map allocates its first slot group (~288 B) on its first
// insert and keeps it when emptied, so every session, turn and request future that lands in a
// fresh map costs a group that outlives it: 2.7 MiB of empty maps when the daemon starts, ~9 MiB
// once each has seen an id, and in the G7 benchmark (5,000 new sessions) more per idle session
// than the session itself. The 1024 maps already stripe the locks far beyond what 2–64 cores
// contend for, so each needs one shard.
//
// cmap.SHARD_COUNT is read by every cmap.New and by every lookup, so it may only be set before
// the first map exists and never again: here, at package initialisation, before any actor
// system can be built (protoactor creates no map of its own before NewActorSystem). The only
// other cmap in protoactor is the cluster's PID cache, which becomes one map behind one lock:
// revisit this when cluster mode is built.
func init() { cmap.SHARD_COUNT = 1 }
