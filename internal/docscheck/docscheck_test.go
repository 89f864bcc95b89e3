package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/metrics"
)

// The pages this package holds to the code. Code comments cite them by
// these names.
const (
	apiDoc          = "docs/API.md"
	queueDoc        = "docs/QUEUE.md"
	operationsDoc   = "docs/OPERATIONS.md"
	architectureDoc = "docs/ARCHITECTURE.md"
	metricsDoc      = "docs/METRICS.md"
	benchmarksDoc   = "docs/BENCHMARKS.md"
)

// repoRoot returns the directory holding go.mod, above the test's working
// directory.
func repoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func readDoc(tb testing.TB, rel string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(tb), rel))
	if err != nil {
		tb.Fatalf("read %s: %v", rel, err)
	}
	return string(b)
}

// section returns the text of the `## title` section of doc, up to the next
// `## ` heading; its `###` subsections belong to it.
func section(tb testing.TB, doc, file, title string) string {
	tb.Helper()
	head := "\n## " + title + "\n"
	i := strings.Index(doc, head)
	if i < 0 {
		tb.Fatalf("%s has no section %q", file, "## "+title)
	}
	rest := doc[i+len(head):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// tableRows maps the backticked first cell of each table row matching
// nameRE to its second cell; a name given twice is reported.
func tableRows(tb testing.TB, text, file, nameRE string) map[string]string {
	tb.Helper()
	re := regexp.MustCompile("(?m)^\\| `(" + nameRE + ")` \\| ([^|]*) \\|")
	rows := make(map[string]string)
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		if _, dup := rows[m[1]]; dup {
			tb.Errorf("%s: %s has two rows", file, m[1])
		}
		rows[m[1]] = strings.TrimSpace(m[2])
	}
	return rows
}

// settingNames are the env names internal/config reads.
func settingNames(tb testing.TB) map[string]bool {
	tb.Helper()
	names := make(map[string]bool)
	ct := reflect.TypeFor[config.Config]()
	for i := range ct.NumField() {
		name, _, _ := strings.Cut(ct.Field(i).Tag.Get("env"), ",")
		if name != "" {
			names[name] = true
		}
	}
	if len(names) < 10 {
		tb.Fatalf("found %d env tags on config.Config; the reflection no longer sees the settings", len(names))
	}
	return names
}

// TestSettingsDocumented: every env var internal/config reads has a row in
// the Settings section of docs/OPERATIONS.md whose default column shows
// the code's default (config.DefaultValues, which takes each from the
// component that uses it) exactly, and every row names a setting the code
// reads.
func TestSettingsDocumented(t *testing.T) {
	t.Parallel()
	names := settingNames(t)
	defaults := config.DefaultValues()
	rows := tableRows(t, section(t, readDoc(t, operationsDoc), operationsDoc, "Settings"), operationsDoc, "[A-Z][A-Z0-9_]*")
	for name := range names {
		cell, ok := rows[name]
		def, hasDef := defaults[name]
		switch {
		case !ok:
			t.Errorf("%s: setting %s has no row in the Settings section", operationsDoc, name)
		case hasDef && !strings.Contains(cell, "`"+def+"`"):
			t.Errorf("%s: setting %s shows default %q, the code's default is `%s`", operationsDoc, name, cell, def)
		}
	}
	for name := range rows {
		if !names[name] {
			t.Errorf("%s: the Settings section documents %s, which internal/config does not read", operationsDoc, name)
		}
	}
}

// TestExampleSettingsShowDefaults: every setting configs/spillway.yaml
// gives a plain value shows the code's default, so the file, loaded as is,
// changes nothing.
func TestExampleSettingsShowDefaults(t *testing.T) {
	t.Parallel()
	const file = "configs/spillway.yaml"
	var doc map[string]yaml.Node
	if err := yaml.Unmarshal([]byte(readDoc(t, file)), &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	defaults := config.DefaultValues()
	checked := 0
	for key, n := range doc {
		name := strings.ToUpper(key)
		def, ok := defaults[name]
		if !ok || n.Kind != yaml.ScalarNode {
			continue
		}
		checked++
		if n.Value != def {
			t.Errorf("%s: %s: %q, the code's default is %q", file, key, n.Value, def)
		}
	}
	if checked < len(defaults)/2 {
		t.Errorf("%s: only %d of %d defaults checked; the file no longer lists the settings", file, checked, len(defaults))
	}
}

var slugRE = regexp.MustCompile(`^[a-z]+(-[a-z]+)*$`)

// problemSlugs finds every problem type slug the code can send: string
// constants named Problem… whose value is a slug, and string literals given
// as the first argument of a NewProblem call, in every non-test Go file.
func problemSlugs(tb testing.TB) map[string]string {
	tb.Helper()
	root := repoRoot(tb)
	slugs := make(map[string]string) // slug → where it was found
	fset := token.NewFileSet()
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
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, name := range n.Names {
					if !strings.HasPrefix(name.Name, "Problem") || i >= len(n.Values) {
						continue
					}
					if s, ok := stringLit(n.Values[i]); ok && slugRE.MatchString(s) {
						slugs[s] = rel
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return slugs
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// TestProblemTypesDocumented: every problem type slug in the code has a row
// in the Problem types section of docs/API.md, and every row is a slug the
// code can send.
func TestProblemTypesDocumented(t *testing.T) {
	t.Parallel()
	slugs := problemSlugs(t)
	for _, must := range []string{"bad-request", "queue-overflow", "worker-lost"} {
		if _, ok := slugs[must]; !ok {
			t.Fatalf("the scan of the code found no slug %q (found %d); it no longer sees the problem catalogue", must, len(slugs))
		}
	}
	rows := tableRows(t, section(t, readDoc(t, apiDoc), apiDoc, "Problem types"), apiDoc, "[a-z]+(?:-[a-z]+)*")
	for slug, where := range slugs {
		if _, ok := rows[slug]; !ok {
			t.Errorf("%s: problem type %q (in %s) has no row in the Problem types section", apiDoc, slug, where)
		}
	}
	for slug := range rows {
		if _, ok := slugs[slug]; !ok {
			t.Errorf("%s: the Problem types section documents %q, which no code sends", apiDoc, slug)
		}
	}
}

// recorder is a prometheus.Registerer that keeps what is registered, so
// label vectors with no series yet are seen too.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// TestMetricsDocumented: every metric metrics.New (and the upstream
// balancer) registers has a row in docs/METRICS.md, and every row is one.
func TestMetricsDocumented(t *testing.T) {
	t.Parallel()
	rec := &recorder{Registerer: prometheus.NewRegistry()}
	metrics.New(rec)
	// The per-upstream metrics are registered by the balancer, only when
	// there are several upstreams.
	if _, err := upstream.NewPrometheus(rec); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqNameRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no fqName in %s", d)
			}
			names = append(names, m[1])
		}
	}
	if len(names) < 10 {
		t.Fatalf("metrics.New registered %d metrics; the recorder no longer sees them", len(names))
	}
	rows := tableRows(t, readDoc(t, metricsDoc), metricsDoc, "spillway_[a-z0-9_]+")
	for _, n := range names {
		if _, ok := rows[n]; !ok {
			t.Errorf("%s: metric %s has no table row", metricsDoc, n)
		}
	}
	for n := range rows {
		if !slices.Contains(names, n) {
			t.Errorf("%s: documents %s, which metrics.New does not register", metricsDoc, n)
		}
	}
}

// markdownFiles returns README.md and every page under docs/, relative to
// the root.
func markdownFiles(tb testing.TB) []string {
	tb.Helper()
	root := repoRoot(tb)
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		tb.Fatal(err)
	}
	files := []string{"README.md"}
	for _, p := range pages {
		rel, _ := filepath.Rel(root, p)
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	schemeRE  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	// anchorDrop is what GitHub removes from a heading to make its anchor.
	anchorDrop = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// anchors returns the GitHub anchors of a markdown document's headings.
func anchors(doc string) map[string]bool {
	out := make(map[string]bool)
	for _, m := range headingRE.FindAllStringSubmatch(doc, -1) {
		a := strings.ToLower(anchorDrop.ReplaceAllString(m[1], ""))
		out[strings.ReplaceAll(a, " ", "-")] = true
	}
	return out
}

// TestLinksStayInRepository: every relative link in README.md and docs/
// points at a file inside the repository that exists, and every #anchor
// at a heading of its page.
func TestLinksStayInRepository(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	checked := 0
	for _, file := range markdownFiles(t) {
		doc := readDoc(t, file)
		for _, m := range linkRE.FindAllStringSubmatch(doc, -1) {
			target := m[1]
			if schemeRE.MatchString(target) {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
				if dest == ".." || strings.HasPrefix(dest, "../") || filepath.IsAbs(path) {
					t.Errorf("%s: link %s leaves the repository", file, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
					t.Errorf("%s: link %s: %s does not exist", file, target, dest)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") && !anchors(readDoc(t, dest))[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", file, target, dest, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found; the link pattern no longer matches")
	}
}

// TestReadmeListsDocs: the README links every page under docs/.
func TestReadmeListsDocs(t *testing.T) {
	t.Parallel()
	readme := readDoc(t, "README.md")
	for _, page := range []string{apiDoc, queueDoc, operationsDoc, architectureDoc, metricsDoc, benchmarksDoc} {
		readDoc(t, page) // the page exists
		if !strings.Contains(readme, "]("+page+")") {
			t.Errorf("README.md does not link %s", page)
		}
	}
}

// Written in two pieces so this file does not match itself.
var outsideRefs = []string{"../" + "shared", "DESIGN" + ".md"}

// skipDir reports directories that hold no sources of the repository.
func skipDir(name string) bool {
	switch name {
	case ".git", "bin", "bench-results", "node_modules", "vendor":
		return true
	}
	return false
}

// outsideReferences lists "path:line" of every line in the repository's
// text files that refers to a file outside it (the design notes the
// project started from).
func outsideReferences(tb testing.TB) []string {
	tb.Helper()
	root := repoRoot(tb)
	var found []string
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
		switch filepath.Ext(path) {
		case ".go", ".md", ".yaml", ".yml", ".sh", ".lua", ".json", ".conf", ".txt", ".mod":
		default:
			if d.Name() != "Makefile" && d.Name() != "Dockerfile" {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for i, line := range strings.Split(string(b), "\n") {
			for _, ref := range outsideRefs {
				if strings.Contains(line, ref) {
					found = append(found, filepath.ToSlash(rel)+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return found
}

// TestDocsStandAlone: no file but Go source refers to a file outside the
// repository; Go comments still doing so are listed in the log until
// TestNoOutsideReferences (build tag docscheck_strict) takes over.
func TestDocsStandAlone(t *testing.T) {
	t.Parallel()
	var goRefs int
	for _, ref := range outsideReferences(t) {
		path, _, _ := strings.Cut(ref, ":")
		if strings.HasSuffix(path, ".go") {
			goRefs++
			t.Logf("still cites a file outside the repository: %s", ref)
			continue
		}
		t.Errorf("refers to a file outside the repository: %s", ref)
	}
	if goRefs > 0 {
		t.Logf("%d Go lines cite files outside the repository; run go test -tags docscheck_strict ./internal/docscheck/ to fail on them", goRefs)
	}
}
