package redistest

import (
	"errors"
	"testing"
)

// StartFail's client is the hooked one, sent once (no retry), and the
// server's plain client is not hooked.
func TestStartFail(t *testing.T) {
	t.Parallel()
	env := StartFail(t)
	ctx := t.Context()
	key := env.Prefix + "k"
	env.Hook.Arm(1, false)
	err := env.Client.Set(ctx, key, "v", 0).Err()
	if fired := env.Hook.Disarm(); !errors.Is(err, ErrInjected) || fired != "set" {
		t.Fatalf("armed SET: %v, failed command %q; want the injected failure of set", err, fired)
	}
	if n, err := env.Server.Client(t).Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("the failed SET reached Redis (or was retried): exists %d, %v", n, err)
	}
	env.Hook.Arm(1, false)
	if err := env.Server.Client(t).Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("the plain client went through the hook: %v", err)
	}
	if fired := env.Hook.Disarm(); fired != "" {
		t.Fatalf("the hook saw the plain client's %s", fired)
	}
	if err := env.Client.Get(ctx, key).Err(); err != nil {
		t.Fatalf("disarmed GET: %v", err)
	}
}
