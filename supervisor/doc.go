// Package supervisor builds and runs agentgate's supervision tree: it opens the store, spawns
// the top-level actors in the order of the tree (persistence, platforms, session manager),
// starts intake, and on stop drains and stops them in reverse order. The tree is data (tree.go);
// restart policies are named constructors (policy.go). Supervisor events are logged at Warn and
// counted in agentgate_actor_restarts_total.
//
// Nothing imports this package but cmd/agentgate and tests.
package supervisor
