package testutil

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryPackageHasOneDocComment walks the module and checks that each package has exactly
// one package comment (STYLE: "Exactly one package comment per package").
func TestEveryPackageHasOneDocComment(t *testing.T) {
	root := filepath.Join("..", "..")
	docs := map[string]int{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "data" || d.Name() == "bin") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		if _, ok := docs[dir]; !ok {
			docs[dir] = 0
		}
		if f.Doc != nil {
			docs[dir]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, n := range docs {
		if n != 1 {
			t.Errorf("package %s has %d package comments, want exactly 1", dir, n)
		}
	}
}
