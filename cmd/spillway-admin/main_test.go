package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/admin"
	"github.com/spillway-dev/spillway/internal/app"
)

// The command line before any Redis is reached: usage, help, bad flags
// and bad configuration each give their documented exit status.
func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	badFile := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(badFile, []byte("no_such_setting: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		environ []string
		code    int
		stdout  string
		stderr  string
	}{
		{"no command", nil, nil, admin.ExitUsage, "", "usage: spillway-admin"},
		{"help", []string{"help"}, nil, admin.ExitOK, "usage: spillway-admin", ""},
		{"unknown command", []string{"frob"}, nil, admin.ExitUsage, "", `unknown command "frob"`},
		{"unknown global flag", []string{"-frob", "list"}, nil, admin.ExitUsage, "", "flag provided but not defined"},
		{"bad setting", []string{"list"}, []string{"QUEUE_TYPE=rabbit"}, admin.ExitUsage, "", "QUEUE_TYPE"},
		{"bad config file", []string{"-config", badFile, "list"}, nil, admin.ExitUsage, "", "no_such_setting"},
		{"embedded mode", []string{"list"}, nil, admin.ExitUsage, "", "REDIS_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, tc.environ, app.AdminIO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d with %q / %q", code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}
