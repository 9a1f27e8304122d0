package rls

import (
	"errors"
	"testing"
)

// A lone UTF-16 surrogate escape is refused: encoding/json would read
// "\ud800" and "\udfff" alike as U+FFFD, one counter for two values. A
// pair, an escaped backslash before a u, and other escapes pass.
func TestLoneSurrogatesAreRefused(t *testing.T) {
	body := func(v string) []byte {
		return []byte(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"` + v + `"}]}]}`)
	}
	for v, bad := range map[string]bool{
		`\ud800`:         true,
		`\udfff`:         true,
		`a\ud800b`:       true,
		`\ud800\u0041`:   true,
		`\udc00\ud800`:   true,
		`\ud83d\ude00`:   false,
		`\\ud800`:        false,
		`\\\ud83d\ude00`: false,
		`\u0041\n\"`:     false,
		`plain`:          false,
	} {
		_, err := DecodeRequest(body(v))
		if got := err != nil && errors.Is(err, ErrInvalid); got != bad {
			t.Errorf("value %s: error %v, want refused %v", v, err, bad)
		}
	}
}
