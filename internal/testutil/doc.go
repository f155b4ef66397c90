// Package testutil holds repository-wide checks run by go test (such as the package-comment
// rule of STYLE.md) and small helpers shared by tests. Production code never imports it.
package testutil
