package llm

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/openaiwire"
	"github.com/spillway-dev/spillway/internal/protocol"
)

func richAnswer(t *testing.T, body string) (*openaiwire.Assembler, Result, []protocol.Chunk) {
	t.Helper()
	req, err := protocol.DecodeOpenAIChat([]byte(body), protocol.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSim(SimConfig{Tokens: 6, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	asm := openaiwire.NewAssembler("r", "m", 1)
	var chunks []protocol.Chunk
	res, err := s.Stream(t.Context(), req, func(c protocol.Chunk) error {
		if c.Raw == nil {
			t.Fatalf("rich answer chunk without raw: %+v", c)
		}
		if !json.Valid(c.Raw) {
			t.Fatalf("chunk %s is not JSON", c.Raw)
		}
		asm.Chunk(c.Raw)
		chunks = append(chunks, c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return asm, res, chunks
}

// The simulator calls the first tool offered, deterministically, its
// arguments in pieces, and answers in text once the tool's result is
// back (docs/API.md, "The simulator").
func TestSimToolCall(t *testing.T) {
	t.Parallel()
	tools := `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}},{"type":"function","function":{"name":"other"}}]`
	asm, res, chunks := richAnswer(t, `{"messages":[{"role":"user","content":"Weather? SIM_TOOL_ARGS={\"city\": \"Paris\"}"}],`+tools+`}`)
	if res.FinishReason != "tool_calls" {
		t.Fatalf("finish %q, want tool_calls", res.FinishReason)
	}
	var obj struct {
		Choices []struct {
			Message struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(asm.Object(), &obj); err != nil {
		t.Fatal(err)
	}
	m := obj.Choices[0].Message
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "get_weather" || m.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` ||
		!strings.HasPrefix(m.ToolCalls[0].ID, "call_") || m.Content != nil {
		t.Fatalf("assembled %s", asm.Object())
	}
	pieces := 0
	for _, c := range chunks {
		if strings.Contains(string(c.Raw), `"arguments":"`) && !strings.Contains(string(c.Raw), `"arguments":""`) {
			pieces++
		}
	}
	if pieces < 2 {
		t.Errorf("arguments came in %d pieces, want several", pieces)
	}
	// The next turn, with the tool's result, gets text.
	_, res, _ = richAnswer(t, `{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_1","content":"21"}],`+tools+`,"n":2}`)
	if res.FinishReason != "stop" {
		t.Errorf("after the tool's result: finish %q, want stop", res.FinishReason)
	}
}

func TestSimReasoningAndChoices(t *testing.T) {
	t.Parallel()
	asm, _, chunks := richAnswer(t, `{"messages":[{"role":"user","content":"Hi"}],"reasoning_effort":"low","n":2}`)
	var obj struct {
		Choices []struct {
			Index   int
			Message struct {
				Content          string `json:"content"`
				ReasoningContent string `json:"reasoning_content"`
			}
		}
		Usage *protocol.Usage
	}
	if err := json.Unmarshal(asm.Object(), &obj); err != nil {
		t.Fatal(err)
	}
	want := strings.Join(SimChunks([]protocol.Message{{Role: "user", Content: "Hi"}}, 3, 6), "")
	if len(obj.Choices) != 2 || obj.Choices[1].Index != 1 || obj.Usage == nil {
		t.Fatalf("assembled %s", asm.Object())
	}
	for _, c := range obj.Choices {
		if c.Message.Content != want || c.Message.ReasoningContent != strings.Join(simReasoning, "") {
			t.Errorf("choice %d: %+v, want content %q after reasoning", c.Index, c.Message, want)
		}
	}
	for _, c := range chunks {
		if strings.Contains(string(c.Raw), "reasoning_content") && !c.Extra {
			t.Errorf("reasoning chunk not marked extra: %s", c.Raw)
		}
	}
}
