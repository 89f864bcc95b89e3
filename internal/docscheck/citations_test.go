package docscheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// citationRE matches a docs page cited in Go source, with the section it
// names when one follows in quotes: `docs/QUEUE.md, "Takeover"`, also
// across a comment's line break.
var citationRE = regexp.MustCompile(`docs/([A-Za-z_-]+\.md)(?:,\s*(?://\s*)?"([^"\n]+)")?`)

// headingLineRE matches a Markdown heading line.
var headingLineRE = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)

// TestCitationsResolve: every docs page a Go file cites exists, and a
// section it names in quotes is a heading of that page (a heading that
// starts with the name, case aside), so a renamed section is caught.
func TestCitationsResolve(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	headings := map[string][]string{}
	headingsOf := func(page string) ([]string, bool) {
		if h, ok := headings[page]; ok {
			return h, h != nil
		}
		b, err := os.ReadFile(filepath.Join(root, "docs", page))
		if err != nil {
			headings[page] = nil
			return nil, false
		}
		var hs []string
		for _, m := range headingLineRE.FindAllStringSubmatch(string(b), -1) {
			hs = append(hs, strings.ToLower(strings.Trim(m[1], "`")))
		}
		headings[page] = hs
		return hs, true
	}
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Ext(path) != ".go" || strings.Contains(path, string(filepath.Separator)+"docscheck"+string(filepath.Separator)) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, m := range citationRE.FindAllStringSubmatch(string(b), -1) {
			checked++
			hs, ok := headingsOf(m[1])
			if !ok {
				t.Errorf("%s cites docs/%s, which does not exist", rel, m[1])
				continue
			}
			if m[2] == "" {
				continue
			}
			want := strings.ToLower(m[2])
			found := false
			for _, h := range hs {
				if strings.HasPrefix(h, want) || strings.Contains(h, want) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s cites docs/%s, %q: no such heading", rel, m[1], m[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("found no docs citations in Go source: the pattern is broken")
	}
}
