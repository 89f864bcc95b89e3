package failover_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestContractsImportNoImplementation holds the layering docs/ARCHITECTURE.md
// describes: no package under internal/failover (contracts, backends,
// gateway, worker) depends on the HTTP layer, admission or the wiring.
func TestContractsImportNoImplementation(t *testing.T) {
	t.Parallel()
	const mod = "github.com/spillway-dev/spillway/internal/"
	forbidden := []string{mod + "stream", mod + "admission", mod + "app"}
	// -deps would print the union; the template names each package with
	// everything it depends on, so a failure says which one.
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, out)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		for _, dep := range fields[1:] {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s depends on %s", fields[0], dep)
				}
			}
		}
		checked++
	}
	if checked < 2 {
		t.Fatalf("checked %d packages; go list found too few under internal/failover", checked)
	}
}
