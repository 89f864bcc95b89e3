package protocol

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestSetAndDeleteMember(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, key, val, set, del string
	}{
		{"replace", `{"a":1,"stream":false,"b":[1,{"stream":2}]}`, "stream", "true",
			`{"a":1,"stream":true,"b":[1,{"stream":2}]}`, `{"a":1,"b":[1,{"stream":2}]}`},
		{"add", `{"a":"x"}`, "stream", "true", `{"a":"x","stream":true}`, `{"a":"x"}`},
		{"add to empty", `{ }`, "k", `"v"`, `{"k":"v" }`, `{ }`},
		{"white space kept", "{ \"a\" : 1 ,\n \"k\" : [ ] }", "k", "2", "{ \"a\" : 1 ,\n \"k\" : 2 }", "{ \"a\" : 1 }"},
		{"first of two", `{"k":1,"a":2}`, "k", "3", `{"k":3,"a":2}`, `{"a":2}`},
		{"escaped key", `{"\u006b":1,"a":"\"}"}`, "k", "2", `{"\u006b":2,"a":"\"}"}`, `{"a":"\"}"}`},
		{"duplicates", `{"k":1,"k":2}`, "k", "3", `{"k":3,"k":3}`, `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := SetMember([]byte(tt.in), tt.key, []byte(tt.val))
			if !ok || string(got) != tt.set {
				t.Errorf("SetMember = %s, %v; want %s", got, ok, tt.set)
			}
			got, ok = DeleteMember([]byte(tt.in), tt.key)
			if !ok || string(got) != tt.del {
				t.Errorf("DeleteMember = %s, %v; want %s", got, ok, tt.del)
			}
		})
	}
	if _, ok := SetMember([]byte(`[1]`), "k", []byte("1")); ok {
		t.Error("SetMember changed an array")
	}
}

// FuzzMembers holds SetMember and DeleteMember to encoding/json: on any
// object encoding/json reads, the result is the same object with the
// member set or gone, and valid JSON.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"stream":false,"x":{"y":[1,2,"}"]}}`, "{\"k\"\t:\n null }", `{"a":"\u00e9\\\""}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var before map[string]any
		if json.Unmarshal(b, &before) != nil || before == nil || tooDeep(b, maxDepth) {
			return
		}
		set, ok := SetMember(b, "k", []byte(`{"v":1}`))
		if !ok {
			t.Fatalf("SetMember refused %q", b)
		}
		var after map[string]any
		if err := json.Unmarshal(set, &after); err != nil {
			t.Fatalf("SetMember(%q) = %q: %v", b, set, err)
		}
		before["k"] = map[string]any{"v": float64(1)}
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("SetMember(%q) = %q: %v, want %v", b, set, after, before)
		}
		del, ok := DeleteMember(b, "k")
		if !ok {
			t.Fatalf("DeleteMember refused %q", b)
		}
		after = nil
		if err := json.Unmarshal(del, &after); err != nil {
			t.Fatalf("DeleteMember(%q) = %q: %v", b, del, err)
		}
		delete(before, "k")
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("DeleteMember(%q) = %q: %v, want %v", b, del, after, before)
		}
	})
}
