package sdktest

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// straightChecks say what each case must show straight against the mock:
// the SDK call worked end to end (multi-step loops ran their tool), so a
// difference through Spillway is Spillway's.
var straightChecks = map[string][]string{
	"openai-chat":                 {`"content":"` + plainText + `"`, `"finish":"stop"`, `"total_tokens":59`},
	"openai-chat-stream":          {`"content":"` + plainText + `"`, `"finish":"stop"`, `"total_tokens":59`},
	"openai-usage-details-stream": {`"cached_tokens":8`, `"reasoning_tokens":5`},
	"ai-usage-details":            {`"cacheReadTokens":8`, `"reasoningTokens":5`},
	"openai-models":               {`"id":"mock-model"`, `"max_model_len":128000`, `"id":"mock-reasoner"`},
	"openai-tool-stream":          {`"finish":"tool_calls"`, `"arguments":"{\"city\":\"Paris\"}"`, `"id":"` + toolCallID + `"`},
	"openai-runtools":             {`"content":"` + toolFinalText + `"`, `"messages":["user","assistant","tool","assistant"]`},
	"openai-parse":                {`"parsed":{"city":"Paris","temperature":21}`},
	"openai-image":                {`"content":"` + imageText + `"`},
	"openai-reasoning-stream":     {`"content":"` + reasonAnswer + `"`, `"reasoning":"` + reasonText + `"`},
	"ai-chat-stream":              {`"text":"` + plainText + `"`, `"finishReason":"stop"`, `"steps":1`},
	"ai-chat-generate":            {`"text":"` + plainText + `"`, `"finishReason":"stop"`, `"steps":1`},
	"ai-chat-tools-stream":        {`"text":"` + toolFinalText + `"`, `"steps":2`, `"forecast":"sunny"`},
	"ai-chat-tools-generate":      {`"text":"` + toolFinalText + `"`, `"steps":2`, `"forecast":"sunny"`},
	"ai-chat-object":              {`"output":{"city":"Paris","temperature":21}`},
	"ai-chat-image":               {`"text":"` + imageText + `"`},
	"ai-responses-generate":       {`"text":"Hello from the Responses API."`},
	"ai-responses-stream":         {`"text":"Hello from the Responses API."`},
	"ai-responses-tools-generate": {`"text":"` + toolFinalText + `"`, `"steps":2`, `"forecast":"sunny"`},
	"ai-responses-tools-stream":   {`"text":"` + toolFinalText + `"`, `"steps":2`, `"forecast":"sunny"`},
	"compat-stream":               {`"text":"` + plainText + `"`, `"finishReason":"stop"`},
	"compat-tools-stream":         {`"text":"` + toolFinalText + `"`, `"steps":2`, `"forecast":"sunny"`},
	"compat-reasoning-stream":     {`"text":"` + reasonAnswer + `"`, `"reasoning":"` + reasonText + `"`},
	"compat-object":               {`"output":{"city":"Paris","temperature":21}`},
	"compat-image":                {`"text":"` + imageText + `"`},
}

// The official openai Node SDK and the Vercel AI SDK against Spillway on
// the direct and the queued path: for each case, what the client got and
// the bodies the upstream received equal those of the same call sent
// straight to the mock (the fields Spillway owns aside).
func TestNodeSDKs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts Redis, two apis and three Node processes")
	}
	ts := targets(t)
	results := runAll(t, ts)
	straight := results[0]

	names := make([]string, 0, len(straightChecks))
	for name := range straightChecks {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, r := range results {
		for name := range r {
			if _, ok := straightChecks[name]; !ok {
				t.Errorf("case %s in cases.mjs has no straight check here", name)
			}
		}
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Run("straight", func(t *testing.T) {
				got, ok := straight[name]
				if !ok {
					t.Fatalf("cases.mjs has no case %s", name)
				}
				for _, want := range straightChecks[name] {
					if !strings.Contains(string(got), want) {
						t.Errorf("straight against the mock the client got\n %s\nwithout %s", got, want)
					}
				}
				if len(ts[0].mock.received(name)) == 0 && name != "openai-models" {
					t.Error("the mock received no request for the case")
				}
			})
			for i, tg := range ts[1:] {
				t.Run(tg.name, func(t *testing.T) {
					sameAsStraight(t, name, straight[name], results[i+1][name], ts[0].mock, tg.mock)
				})
			}
		})
	}
}

// rawJSON is a helper for failure messages.
func rawJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
