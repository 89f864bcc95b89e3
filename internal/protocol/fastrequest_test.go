package protocol

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// imageBody is a chat request of one user message with a text part and an
// inline image of n base64 bytes, as a chat frontend sends a photo.
func imageBody(n int) []byte {
	raw := make([]byte, n/4*3)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range raw {
		raw[i] = byte(r.Uint32())
	}
	return []byte(`{"model":"sim-1","stream":true,"messages":[{"role":"user","content":[` +
		`{"type":"text","text":"What is in this picture?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + base64.StdEncoding.EncodeToString(raw) + `","detail":"auto"}}]}]}`)
}

// smallBody is the common case: a short conversation of text.
const smallBody = `{"model":"sim-1","stream":true,"temperature":0.7,"max_tokens":256,"messages":[` +
	`{"role":"system","content":"You are a helpful assistant."},` +
	`{"role":"user","content":"Hello, who are you?"},` +
	`{"role":"assistant","content":"I am an assistant."},` +
	`{"role":"user","content":"Tell me a joke about \"gateways\"."}]}`

// fastSamples are bodies for the one-pass reader: the shapes it must take
// (so its speed is not lost to declines) and the ones it must leave to
// the full path.
var fastSamples = []string{
	smallBody,
	string(imageBody(64)),
	`{"messages":[{"role":"user","content":"x"}],"prompt":"y"}`,
	`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto"}`,
	`{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"input_text","text":"b\u00e9\ud83c\udf0a"},{"type":"output_text","text":""}]}],"n":2,"stream_options":{"include_usage":true},"reasoning_effort":"low"}`,
	`{"messages":[{"role":"user","content":[]}],"thread_id":null}`,
	`{"messages":[{"role":"user","content":[{"type":"text"}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":null}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"image_url","text":5}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":1,"text":"a"}]}]}`,
	`{"messages":[{"Role":"user","content":"x"}]}`,
	`{"Messages":[{"role":"user","content":"x"}]}`,
	`{"messages":[{"role":"user","content":"x"}],"model":"a","model":"b"}`,
	`{"messages":[{"role":"user","content":"x","content":"y"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`,
	`{"messages":[{"role":"us\u0065r","content":"x"}]}`,
	`{"messages":[{"role":"user","content":"a\u0000b"}]}`,
	`{"messages":[{"role":"user","content":"a\\u0000b"}]}`,
	`{"messages":[{"role":"user","content":"x"}],"m\u006fdel":"b"}`,
	`{"messages":[{"role":"user","content":"x"}],"ſtream":true}`,
	`{"messages":[{"role":"user","content":"x"}],"extra":` + strings.Repeat("[", 63) + "1" + strings.Repeat("]", 63) + `}`,
	`{"messages":[{"role":"user","content":"x"}],"extra":` + strings.Repeat("[", 64) + "1" + strings.Repeat("]", 64) + `}`,
	`{"messages":[{"role":"user","content":"x"}],"temperature":-0.0e+1,"max_completion_tokens":12,"max_tokens":1}`,
	`{"messages":[{"role":"user","content":"x"}],"temperature":01}`,
	`{"messages":[{"role":"user","content":"x"}]} x`,
	`{"messages":[{"role":"user","content":"x"},]}`,
	"{\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}]}",
	"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
	`{"messages":[{"role":"robot","content":"x"}]}`,
	`{"messages":[{"content":"x"}]}`,
	`{"messages":null,"prompt":"p","thread_id":"t"}`,
	`{"prompt":"p","thread_id":"t","thread_id":null}`,
	` {"messages":[ { "role" : "user" , "content" : [ { "type" : "text" , "text" : "a\"\\\/\b\f\n\r\t" } ] } ] } `,
}

// FuzzDecodeChatFast holds the one-pass reader to the full path: for any
// body and limits, on both chat routes, the same request or the same
// error (readChatFast).
func FuzzDecodeChatFast(f *testing.F) {
	for _, s := range append(fastSamples, requestSamples...) {
		f.Add([]byte(s), 1000)
	}
	f.Add([]byte(`{"messages":[{"role":"user","content":"1"},{"role":"user","content":"2"}]}`), 1)
	f.Fuzz(func(t *testing.T, body []byte, maxMessages int) {
		lim := Limits{MaxMessages: maxMessages, MaxTokens: 1 << 20}
		for _, native := range []bool{true, false} {
			route := RouteChat
			if native {
				route = RouteStream
			}
			want, wantErr := decodeChat(body, lim, route, native, false)
			got, gotErr := decodeChat(body, lim, route, native, true)
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("%s %q: error %v, the full path's %v", route, body, gotErr, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s %q:\n got %+v\nwant %+v", route, body, got, want)
			}
		}
	})
}

// The shapes chat clients send are read in one pass, not declined to the
// full path: text, an inline image, a tool conversation, every text part.
func TestReadChatFastTakesCommonShapes(t *testing.T) {
	t.Parallel()
	for i, s := range fastSamples[:7] {
		if _, ok := readChatFast([]byte(s), 1000); !ok {
			t.Errorf("sample %d declined: %s", i, s)
		}
	}
	f, ok := readChatFast(imageBody(1<<20), 1000)
	if !ok || len(f.msgs) != 1 || f.msgs[0].Content != "What is in this picture?" || f.nonText != 1 {
		t.Fatalf("image body: ok %v, %+v", ok, f.msgs)
	}
}

// strEnd finds the end of a string wherever its quote, backslash or
// control character falls within the eight bytes it looks at at a time.
func TestStrEndAtEveryOffset(t *testing.T) {
	t.Parallel()
	for n := range 40 {
		plain := strings.Repeat("a", n)
		for _, tc := range []struct {
			s    string
			ok   bool
			esc  bool
			tail string
		}{
			{`"` + plain + `"`, true, false, ""},
			{`"` + plain + `\"x"`, true, true, ""},
			{`"` + plain + "\x1f" + `"`, false, false, ""},
			{`"` + plain + `\u0000"`, false, false, ""},
			{`"` + plain + `\u00e9"`, true, true, ""},
			{`"` + plain + "\x7f\xc3\xa9" + `"`, true, false, ""},
			{`"` + plain, false, false, ""},
			{`"` + plain + `"` + plain, true, false, plain},
		} {
			end, esc, ok := strEnd([]byte(tc.s), 0)
			if ok != tc.ok || (ok && (esc != tc.esc || tc.s[end:] != tc.tail)) {
				t.Errorf("strEnd(%q) = %d, %v, %v; want ok %v esc %v tail %q", tc.s, end, esc, ok, tc.ok, tc.esc, tc.tail)
			}
		}
	}
}

// BenchmarkDecodeChatRequest is what reading a /v1/stream body costs, on
// the one-pass reader (fast) and on the full path alone (full, what every
// body cost before it): a body with a 1 MiB base64 image, and a short
// text conversation, the common case. ms/MiB is CPU per MiB of body.
func BenchmarkDecodeChatRequest(b *testing.B) {
	for _, body := range []struct {
		name string
		b    []byte
	}{
		{"image-1MiB", imageBody(1 << 20)},
		{"text-small", []byte(smallBody)},
	} {
		for _, path := range []struct {
			name string
			fast bool
		}{{"fast", true}, {"full", false}} {
			b.Run(body.name+"/"+path.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(body.b)))
				for b.Loop() {
					if _, err := decodeChat(body.b, DefaultLimits, RouteStream, true, path.fast); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e6/float64(b.N)/(float64(len(body.b))/(1<<20)), "ms/MiB")
			})
		}
	}
}
