package sdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// goResult is what an openai-go call shows its caller.
type goResult struct {
	Content   string          `json:"content"`
	Finish    string          `json:"finish"`
	ToolCalls []goToolCall    `json:"tool_calls"`
	Usage     json.RawMessage `json:"usage"`
}

type goToolCall struct {
	ID, Name, Arguments string
}

// goCases are the openai-go calls, each given its case marker.
var goCases = map[string]func(ctx context.Context, c openai.Client, name string) (goResult, error){
	"go-chat": func(ctx context.Context, c openai.Client, name string) (goResult, error) {
		return goCreate(ctx, c, chatParams(name, "Say hello.", false))
	},
	"go-chat-stream": func(ctx context.Context, c openai.Client, name string) (goResult, error) {
		return goStream(ctx, c, chatParams(name, "Say hello.", false))
	},
	"go-tool": func(ctx context.Context, c openai.Client, name string) (goResult, error) {
		return goCreate(ctx, c, chatParams(name, "Weather in Paris?", true))
	},
	"go-tool-stream": func(ctx context.Context, c openai.Client, name string) (goResult, error) {
		return goStream(ctx, c, chatParams(name, "Weather in Paris?", true))
	},
}

func chatParams(name, text string, tools bool) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:         mockModel,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("[case:%s] %s", name, text))},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	if tools {
		p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
			Name:       toolName,
			Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
		})}
	}
	return p
}

func goCreate(ctx context.Context, c openai.Client, p openai.ChatCompletionNewParams) (goResult, error) {
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	r, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		return goResult{}, err
	}
	return fromCompletion(r), nil
}

func goStream(ctx context.Context, c openai.Client, p openai.ChatCompletionNewParams) (goResult, error) {
	s := c.Chat.Completions.NewStreaming(ctx, p)
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	if err := s.Err(); err != nil {
		return goResult{}, err
	}
	return fromCompletion(&acc.ChatCompletion), nil
}

func fromCompletion(r *openai.ChatCompletion) goResult {
	var res goResult
	if len(r.Choices) > 0 {
		ch := r.Choices[0]
		res.Content, res.Finish = ch.Message.Content, ch.FinishReason
		for _, tc := range ch.Message.ToolCalls {
			res.ToolCalls = append(res.ToolCalls, goToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
	}
	res.Usage = json.RawMessage(r.Usage.RawJSON())
	if len(res.Usage) == 0 {
		u, _ := json.Marshal(r.Usage)
		res.Usage = u
	}
	return res
}

// openai-go, streamed and not, plain and with a tool call, against
// Spillway on both paths, compared with the same call straight to the
// mock.
func TestOpenAIGo(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts Redis and two apis")
	}
	ts := targets(t)
	straightChecks := map[string]goResult{
		"go-chat":        {Content: plainText, Finish: "stop"},
		"go-chat-stream": {Content: plainText, Finish: "stop"},
		"go-tool":        {Finish: "tool_calls", ToolCalls: []goToolCall{{toolCallID, toolName, toolArgs}}},
		"go-tool-stream": {Finish: "tool_calls", ToolCalls: []goToolCall{{toolCallID, toolName, toolArgs}}},
	}
	for name, run := range goCases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			results := make([]json.RawMessage, len(ts))
			for i, tg := range ts {
				c := openai.NewClient(option.WithBaseURL(tg.url), option.WithAPIKey(clientKey), option.WithMaxRetries(0))
				res, err := run(t.Context(), c, name)
				if err != nil {
					results[i], _ = json.Marshal(map[string]string{"error": err.Error()})
					continue
				}
				results[i], _ = json.Marshal(res)
			}
			t.Run("straight", func(t *testing.T) {
				var got goResult
				if err := json.Unmarshal(results[0], &got); err != nil || got.Content != straightChecks[name].Content ||
					got.Finish != straightChecks[name].Finish || rawJSON(got.ToolCalls) != rawJSON(straightChecks[name].ToolCalls) ||
					len(got.Usage) == 0 {
					t.Fatalf("straight against the mock: %s (%v)", results[0], err)
				}
			})
			for i, tg := range ts[1:] {
				t.Run(tg.name, func(t *testing.T) {
					sameAsStraight(t, name, results[0], results[i+1], ts[0].mock, tg.mock)
				})
			}
		})
	}
}
