package bench

import (
	"errors"
	"slices"
	"testing"
)

func TestParseInto(t *testing.T) {
	for in, want := range map[string][]int{"": nil, "host": nil, "cuda": {0}, "cuda:1": {1}, "cuda:0,1": {0, 1}, "cuda:3,0,2": {3, 0, 2}} {
		got, pinned, err := ParseInto(in)
		if err != nil || !slices.Equal(got, want) || pinned {
			t.Errorf("ParseInto(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, want := range map[string][]int{"pinned": {0}, "pinned:1,2": {1, 2}} {
		got, pinned, err := ParseInto(in)
		if err != nil || !slices.Equal(got, want) || !pinned {
			t.Errorf("ParseInto(%q) = %v, %v, %v; want %v, pinned", in, got, pinned, err, want)
		}
	}
	for _, in := range []string{"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:0,0", "cuda:0,", "cuda0", "pinned0", "pinned:"} {
		if _, _, err := ParseInto(in); !errors.Is(err, ErrConfig) {
			t.Errorf("ParseInto(%q): %v, want ErrConfig", in, err)
		}
	}
}
