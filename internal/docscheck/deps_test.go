package docscheck

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated blocks of the docs from the code")

const (
	depsBegin = "<!-- deps:begin (generated from go list: go test ./internal/docscheck -run TestArchitectureDependencies -update) -->"
	depsEnd   = "<!-- deps:end -->"
)

// TestArchitectureDependencies holds docs/ARCHITECTURE.md's dependency
// block to the code: each package of the module (test kits and packages
// of tests only aside) with the packages of the module it imports, from
// `go list`, the importers above what they import. -update rewrites it.
func TestArchitectureDependencies(t *testing.T) {
	root := repoRoot(t)
	want := dependencyBlock(t, root)
	path := filepath.Join(root, "docs", "ARCHITECTURE.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, depsBegin), strings.Index(doc, depsEnd)
	if i < 0 || j < i {
		t.Fatalf("docs/ARCHITECTURE.md lacks the markers %q … %q", depsBegin, depsEnd)
	}
	got := doc[i+len(depsBegin) : j]
	if got == want {
		return
	}
	if *update {
		doc = doc[:i+len(depsBegin)] + want + doc[j:]
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/ARCHITECTURE.md's dependency block differs from the code; run\n"+
		"  go test ./internal/docscheck -run TestArchitectureDependencies -update\ngot:%s\nwant:%s", got, want)
}

// dependencyBlock lists, from go list, each non-test package of the module
// with the module's packages it imports, in a fenced block.
func dependencyBlock(tb testing.TB, root string) string {
	tb.Helper()
	// A package whose only file is doc.go holds tests only (docscheck,
	// faults, sdktest, deploy): not part of what runs.
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{if eq (join .GoFiles " ") "doc.go"}}tests-only{{else}}code{{end}} {{join .Imports " "}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("go list: %v", err)
	}
	const module = "github.com/spillway-dev/spillway/"
	short := func(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "internal/") }
	skip := func(p string) bool {
		return strings.HasPrefix(p, "testkit/") || strings.HasPrefix(p, "scripts/")
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := short(f[0])
		if skip(pkg) || f[1] == "tests-only" {
			continue
		}
		deps[pkg] = []string{}
		for _, imp := range f[2:] {
			if strings.HasPrefix(imp, module) && !skip(short(imp)) {
				deps[pkg] = append(deps[pkg], short(imp))
			}
		}
	}
	level := map[string]int{}
	var levelOf func(p string) int
	levelOf = func(p string) int {
		if l, ok := level[p]; ok {
			return l
		}
		level[p] = 0 // Go forbids cycles; this only ends the recursion
		l := 0
		for _, d := range deps[p] {
			l = max(l, levelOf(d)+1)
		}
		level[p] = l
		return l
	}
	pkgs := make([]string, 0, len(deps))
	for p := range deps {
		levelOf(p)
		pkgs = append(pkgs, p)
	}
	slices.SortFunc(pkgs, func(a, b string) int {
		return cmp.Or(cmp.Compare(level[b], level[a]), cmp.Compare(a, b))
	})
	width := 0
	for _, p := range pkgs {
		width = max(width, len(p))
	}
	var sb strings.Builder
	sb.WriteString("\n```\n")
	for _, p := range pkgs {
		ds := deps[p]
		slices.Sort(ds)
		if len(ds) == 0 {
			fmt.Fprintf(&sb, "%-*s   (no package of the module)\n", width, p)
			continue
		}
		fmt.Fprintf(&sb, "%-*s ─▶ %s\n", width, p, strings.Join(ds, ", "))
	}
	sb.WriteString("```\n")
	return sb.String()
}

// TestArchitectureListsEveryPackage: docs/ARCHITECTURE.md's package table
// has a row for every package of the module that runs (test kits aside).
func TestArchitectureListsEveryPackage(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	cmd := exec.Command("go", "list", "-f", `{{if ne (join .GoFiles " ") "doc.go"}}{{.ImportPath}}{{end}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		p = strings.TrimPrefix(p, "github.com/spillway-dev/spillway/")
		if strings.HasPrefix(p, "internal/testkit/") || strings.HasPrefix(p, "scripts/") {
			continue
		}
		if !strings.Contains(doc, "| `"+p+"` |") {
			t.Errorf("docs/ARCHITECTURE.md's package table has no row | `%s` |", p)
		}
	}
}
