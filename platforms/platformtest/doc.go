// Package platformtest holds test helpers for code that drives a platforms.Platform: Fake, an
// in-memory platform that injects inbound messages through the Deliver func it was given in Run
// and records every Outbound passed to Send; and EditorFake, a Fake that is also a
// platforms.Editor and records the drafts it posts and edits.
//
// Fake and EditorFake are safe for concurrent use. This package must not import actors, supervisor or any
// platform adapter.
package platformtest
