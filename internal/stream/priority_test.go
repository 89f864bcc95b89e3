package stream_test

import (
	"net/http"
	"testing"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// X-Priority reaches the gate and the job: none is normal, an ask above
// PRIORITY_MAX is lowered to it, not refused.
func TestHandlerPriority(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		max    protocol.Priority
		header string // "" sends none
		want   protocol.Priority
	}{
		{"none is normal", "", "", protocol.PriorityNormal},
		{"low kept", "", "low", protocol.PriorityLow},
		{"normal kept", "", "normal", protocol.PriorityNormal},
		{"high lowered to the default maximum", "", "high", protocol.PriorityNormal},
		{"high kept under a high maximum", protocol.PriorityHigh, "high", protocol.PriorityHigh},
		{"none stays normal under a high maximum", protocol.PriorityHigh, "", protocol.PriorityNormal},
		{"normal lowered to a low maximum", protocol.PriorityLow, "normal", protocol.PriorityLow},
		{"none lowered to a low maximum", protocol.PriorityLow, "", protocol.PriorityLow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			relay := newFakeRelay(protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop"}})
			sp := &fakeSpiller{relay: relay}
			gate := &fakeGate{}
			h := newHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{},
				spiller: sp, gate: gate, priorityMax: tt.max})
			hdr := map[string]string{}
			if tt.header != "" {
				hdr["X-Priority"] = tt.header
			}
			w := post(h, validBody, hdr)
			if w.Code != http.StatusOK {
				t.Fatalf("HTTP %d body %q, want a queued stream", w.Code, w.Body.String())
			}
			<-relay.closed
			if len(sp.jobs) != 1 || sp.jobs[0].Priority != tt.want {
				t.Fatalf("jobs %+v, want one of priority %q", sp.jobs, tt.want)
			}
			if len(gate.admitted) != 1 || gate.admitted[0] != tt.want || len(gate.queuing) != 1 || gate.queuing[0] != tt.want {
				t.Errorf("gate asked Admit %q, MayQueue %q; want %q each once", gate.admitted, gate.queuing, tt.want)
			}
		})
	}
}

// A value other than high, normal or low is a 400, before admission.
func TestHandlerPriorityInvalid(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"HIGH", "urgent", "1", " high", "high,low"} {
		gate := &fakeGate{}
		sp := &fakeSpiller{}
		h := newHandler(t, deps{pool: &fakePool{free: 1}, provider: &fakeProvider{}, spiller: sp, gate: gate})
		w := post(h, validBody, map[string]string{"X-Priority": v})
		if w.Code != http.StatusBadRequest {
			t.Fatalf("X-Priority %q: HTTP %d, want 400", v, w.Code)
		}
		if p := problemOf(t, w); p.Slug() != protocol.ProblemBadRequest {
			t.Errorf("X-Priority %q: problem %q, want bad-request", v, p.Slug())
		}
		if len(gate.admitted) != 0 || len(sp.jobs) != 0 {
			t.Errorf("X-Priority %q: admitted %v, jobs %d; want refused before both", v, gate.admitted, len(sp.jobs))
		}
	}
}

func TestConfigPriorityMax(t *testing.T) {
	t.Parallel()
	_, err := stream.New(stream.Config{MaxBodyBytes: 1, Limits: protocol.DefaultLimits, Heartbeat: 1,
		PriorityMax: "urgent"}, stream.Deps{Pool: &fakePool{}, Provider: &fakeProvider{}, Log: testutil.DiscardLogger()})
	if err == nil {
		t.Fatal("stream.New with PriorityMax urgent: nil error")
	}
}

// An API key's own maximum (API_KEYS entry key=high) overrides PRIORITY_MAX.
func TestHandlerPriorityKeyMaximum(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]protocol.Priority{"hi": protocol.PriorityHigh, "plain": protocol.PriorityNormal, "lo": protocol.PriorityLow} {
		relay := newFakeRelay(protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop"}})
		sp := &fakeSpiller{relay: relay}
		h := newHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{}, spiller: sp,
			gate: &fakeGate{}, keys: []string{"hi=high", "plain", "lo=low"}})
		w := post(h, validBody, map[string]string{"Authorization": "Bearer " + key, "X-Priority": "high"})
		if w.Code != http.StatusOK {
			t.Fatalf("key %s: HTTP %d body %q", key, w.Code, w.Body.String())
		}
		<-relay.closed
		if len(sp.jobs) != 1 || sp.jobs[0].Priority != want {
			t.Errorf("key %s asking high: jobs %+v, want priority %q", key, sp.jobs, want)
		}
	}
}
