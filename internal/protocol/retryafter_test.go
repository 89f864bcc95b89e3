package protocol_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// TestRetryAfterSeconds pins the one meaning of Retry-After: rounded up to
// whole seconds, at least 1.
func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 1}, {0, 1}, {time.Nanosecond, 1}, {999 * time.Millisecond, 1}, {time.Second, 1},
		{time.Second + time.Nanosecond, 2}, {1500 * time.Millisecond, 2}, {1999 * time.Millisecond, 2},
		{2 * time.Second, 2}, {2500 * time.Millisecond, 3}, {59*time.Second + time.Millisecond, 60}, {60 * time.Second, 60},
	}
	for _, tt := range tests {
		if got := protocol.RetryAfterSeconds(tt.d); got != tt.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
}

// ownRounding matches the ways Retry-After used to be rounded in place:
// up by hand, or truncated by dividing a RetryAfter by a second.
var ownRounding = regexp.MustCompile(`time\.Second\s*-\s*1\)\s*/\s*time\.Second|RetryAfter\w*\s*/\s*time\.Second|RetryAfter\w*\.Round\(time\.Second\)`)

// TestRetryAfterRoundedInOnePlace: no product code outside RetryAfterSeconds
// turns a duration into Retry-After seconds by itself, so the two meanings
// (rounded up, truncated) cannot come back.
func TestRetryAfterRoundedInOnePlace(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	checked := 0
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			if filepath.ToSlash(path) == "../../internal/protocol/problem.go" {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			checked++
			if m := ownRounding.Find(b); m != nil {
				t.Errorf("%s rounds a Retry-After itself (%q); use protocol.RetryAfterSeconds", path, m)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d files; the walk no longer sees the code", checked)
	}
}
