package bytesize

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		s  string
		v  int64
		ok bool
	}{{"4096", 4096, true}, {"256MiB", 256 << 20, true}, {"4GiB", 4 << 30, true}, {"1g", 1 << 30, true}, {"512k", 512 << 10, true},
		{" 2 TB ", 2 << 40, true}, {"0", 0, true},
		{"", 0, false}, {"MiB", 0, false}, {"-1", 0, false}, {"12XB", 0, false}, {"99999999999999999999", 0, false}, {"9000000000T", 0, false}} {
		v, err := Parse(c.s)
		if (err == nil) != c.ok || c.ok && v != c.v {
			t.Errorf("Parse(%q) = %d, %v", c.s, v, err)
		}
		if err != nil && !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q): %v does not wrap ErrSyntax", c.s, err)
		}
	}
}
