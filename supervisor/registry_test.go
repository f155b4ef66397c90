package supervisor

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
)

// TestProcessRegistryHasOneShardPerBucket checks what registry.go relies on: an actor system
// built in this process gets a process registry whose 1024 buckets have one map each, so ids
// no longer scatter over 32,768 Go maps.
func TestProcessRegistryHasOneShardPerBucket(t *testing.T) {
	system := actor.NewActorSystem()
	defer system.Shutdown()
	buckets := system.ProcessRegistry.LocalPIDs.LocalPIDs
	if len(buckets) == 0 {
		t.Fatal("the process registry has no buckets")
	}
	for i, b := range buckets {
		if len(b) != 1 {
			t.Fatalf("registry bucket %d has %d shards, want 1 (%d buckets)", i, len(b), len(buckets))
		}
	}
	pid, err := system.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "registry-probe")
	if err != nil {
		t.Fatalf("spawn: %v", err)
	}
	if p, ok := system.ProcessRegistry.Get(pid); !ok || p == nil {
		t.Errorf("the registry does not find the actor it just spawned, %v", pid)
	}
}
