// Package exec is the agent backend that runs an operator-configured command once per turn
// (agent.backend: exec, DESIGN §5). The command gets the turn on stdin as one JSON object (see
// EncodeInput), the turn's identity in its environment, and answers on stdout.
//
// Steering (DESIGN §3, queue mode steer) is optional: the operator declares with Config.Steer
// (agent.exec.steer) that the command supports it, and only then does CanSteer report true.
// A steering command's stdin carries the input object line, then one {"steer": {...}} line
// (EncodeSteer) per message steered into the running turn, and closes when the turn's
// messages end (the caller closes Request.Steer after the turn). Such a command must read
// stdin line by line, without read-ahead: Run counts a steered message seen once its line has
// left the pipe, and cannot see into a reader's buffer. For an agent without steering, the
// caller falls back to followup and stdin closes right after the input object.
//
// A command gets stdin, stdout and stderr, and no other descriptor of the daemon's: before the
// first one starts, the descriptors the process inherited without close-on-exec are given it
// (Linux). Ready reports whether the command can be started, for the daemon's /readyz.
//
// Identity (DESIGN G1): the child's environment is built afresh for every call from the
// daemon's environment with every AGENTGATE_* variable removed, plus exactly the variables of
// the request's identity.Turn. Nothing is ever written to the daemon's own environment, so a
// value that leaked into it, or the identity of a session running at the same time, can never
// reach a child.
//
// Concurrency: an Agent is immutable after New and Run is safe for concurrent use. Each call
// owns its child process group and, for its duration, the goroutines os/exec starts to feed
// stdin and drain stdout and stderr, plus a timer that escalates SIGTERM to SIGKILL after a
// cancel. When steering, a goroutine of the call writes stdin instead: it forwards
// Request.Steer until that is closed, the command exits or ctx ends, and a write blocked on a
// full pipe ends at a write deadline Run sets once the command has exited (a leftover process
// may hold the pipe). All of them end before Run
// returns, and Run kills whatever is left of the process group before it returns, so no
// process started for a turn outlives the turn, unless it left the group (setsid): a process
// group is all that a signal of Run reaches.
//
// This package must not import actors, supervisor or platforms.
package exec
