package protocol_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// TestProblemCatalogue holds that every slug constant declared in
// problem.go has one catalogue entry with a title and an error status, and
// that the catalogue has no entry without a constant.
func TestProblemCatalogue(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "problem.go", nil, 0)
	if err != nil {
		t.Fatalf("parse problem.go: %v", err)
	}
	slugs := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			if !strings.HasPrefix(name.Name, "Problem") || name.Name == "ProblemTypeBase" || i >= len(vs.Values) {
				continue
			}
			lit, ok := vs.Values[i].(*ast.BasicLit)
			if !ok {
				continue
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatalf("%s: %v", name.Name, err)
			}
			slugs[s] = true
		}
		return true
	})
	if len(slugs) < 10 {
		t.Fatalf("found only %d slug constants in problem.go; the parse is wrong", len(slugs))
	}
	for s := range slugs {
		pt, ok := protocol.Problems[s]
		if !ok {
			t.Errorf("slug %q has no catalogue entry", s)
			continue
		}
		if pt.Slug != s || pt.Type != protocol.ProblemTypeBase+s || pt.Title == "" || pt.Status < 400 || http.StatusText(pt.Status) == "" {
			t.Errorf("catalogue entry %q = %+v: want its slug, a title and an error status", s, pt)
		}
	}
	for s := range protocol.Problems {
		if !slugs[s] {
			t.Errorf("catalogue entry %q has no slug constant", s)
		}
	}
}

// TestProblemConstructorsUseTheCatalogue holds that each constructor's
// problem carries its type's catalogued title and status.
func TestProblemConstructorsUseTheCatalogue(t *testing.T) {
	t.Parallel()
	for _, p := range []*protocol.Problem{
		protocol.BadRequest("x"), protocol.Unauthorized("x"), protocol.NotFound(), protocol.MethodNotAllowed("GET"),
		protocol.BodyTooLarge(1), protocol.TooLargeToQueue(1 << 20), protocol.UnsupportedMedia(), protocol.RateLimited(1),
		protocol.PoolExhausted(1), protocol.QueueOverflow(1), protocol.QueueTimeout(1), protocol.QueueUnavailable(1),
		protocol.ResultChannelLost(1), protocol.ProviderFailed(1), protocol.ProviderUnavailable(1),
		protocol.WorkerLost(1), protocol.SlowClient(1), protocol.ShuttingDown(1), protocol.NotReady(1),
		protocol.StreamFailed(), protocol.RequestFailed(),
	} {
		pt, ok := protocol.Problems[p.Slug()]
		if !ok {
			t.Errorf("%q: not in the catalogue", p.Type)
			continue
		}
		if p.Title != pt.Title || p.Status != pt.Status || p.Detail == "" {
			t.Errorf("%q = %q %d %q, want catalogue title %q status %d and a detail", p.Type, p.Title, p.Status, p.Detail, pt.Title, pt.Status)
		}
	}
}
