package testutil

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRunbookQuotesRealLogLines: every log line docs/RUNBOOK.md explains or README.md quotes
// (`WRN …`, `ERR …`, `INF …`) is a message the code logs, word for word, so the docs cannot go
// on explaining a line that was reworded or removed. The other way round, that every WRN and
// ERR line has its row, is TestRunbookExplainsEveryWarnAndError.
func TestRunbookQuotesRealLogLines(t *testing.T) {
	root := filepath.Join("..", "..")
	var code strings.Builder
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "data" || d.Name() == "bin") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		code.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// README.md quotes log lines too (a line may wrap inside its backquotes there).
	for _, doc := range []string{"docs/RUNBOOK.md", "README.md"} {
		quoted := regexp.MustCompile("`(?:WRN|ERR|INF) ([^`]+)`").FindAllStringSubmatch(MustReadDoc(t, doc), -1)
		if len(quoted) < 10 {
			t.Fatalf("found %d log lines in %s; the pattern no longer matches how it quotes them", len(quoted), doc)
		}
		for _, q := range quoted {
			msg := strings.TrimSuffix(strings.Join(strings.Fields(q[1]), " "), " …")
			msg = strings.TrimSuffix(msg, " (PostgreSQL)")
			if !strings.Contains(code.String(), `"`+msg) {
				t.Errorf("%s quotes the log line %q, which no code logs", doc, msg)
			}
		}
	}
}
