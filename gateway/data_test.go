package gateway

import (
	"errors"
	"strings"
	"testing"
)

func TestValidTopicRest(t *testing.T) {
	for rest, want := range map[string]bool{
		"": true, "t": true, "telemetry/temp": true, "cmd/reboot": true, "a/b/c/d": true, "x y/é": true,
		"/t": false, "t/": false, "a//b": false, "+": false, "a/#": false, "a+b": false, "$SYS/x": false,
		"a\x00b": false, strings.Repeat("a", 1025): false,
	} {
		if got := ValidTopicRest(rest); got != want {
			t.Errorf("ValidTopicRest(%q) = %v, want %v", rest, got, want)
		}
	}
}

func TestValidateMessage(t *testing.T) {
	ok := Message{Device: "dev-1", Topic: "t", Payload: []byte("x"), QoS: 1}
	if err := ValidateMessage(ok); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		m    Message
		want error
	}{
		{Message{Device: "bad id", Topic: "t"}, ErrInvalidMessage},
		{Message{Device: "d", Topic: "a/+"}, ErrInvalidMessage},
		{Message{Device: "d", QoS: 2}, ErrInvalidMessage},
		{Message{Device: "d", Payload: make([]byte, MaxMessageBytes)}, ErrTooLarge},
	} {
		if err := ValidateMessage(tc.m); !errors.Is(err, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.m.Topic, err, tc.want)
		}
	}
}

// FuzzValidTopicRest: a topic the data path takes has non-empty levels,
// no wildcard, NUL or leading $, and round-trips through its levels.
func FuzzValidTopicRest(f *testing.F) {
	for _, s := range []string{"", "a", "a/b", "/a", "a/", "a//b", "+", "#", "$x", "a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !ValidTopicRest(s) || s == "" {
			return
		}
		if strings.ContainsAny(s, "+#\x00") || s[0] == '$' || len(s) > 1024 {
			t.Fatalf("%q taken", s)
		}
		for _, l := range strings.Split(s, "/") {
			if l == "" {
				t.Fatalf("%q taken with an empty level", s)
			}
		}
	})
}

func TestValidTopicFilter(t *testing.T) {
	for f, want := range map[string]bool{"#": true, "+": true, "a/+/b": true, "a/#": true, "/a": true, "a//b": true, "+/+/#": true,
		"": false, "a#": false, "a/#/b": false, "a+/b": false, "a\x00": false, strings.Repeat("a", 1025): false} {
		if got := ValidTopicFilter(f); got != want {
			t.Errorf("%q: %v, want %v", f, got, want)
		}
	}
}
