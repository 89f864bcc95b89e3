// No file of the repository may refer to a file outside it: a clone must
// stand on its own.

package docscheck

import "testing"

// TestNoOutsideReferences: no file of the repository, Go source included,
// refers to a file outside it, so a clone stands on its own.
func TestNoOutsideReferences(t *testing.T) {
	t.Parallel()
	for _, ref := range outsideReferences(t) {
		t.Errorf("refers to a file outside the repository: %s", ref)
	}
}
