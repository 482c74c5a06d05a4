package bytesize

import (
	"errors"
	"strconv"
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

// FuzzParse: any input parses to a size that is not negative, or fails
// with ErrSyntax; a plain number parses to itself.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"4096", "256MiB", "1g", "512k", "", "-1", "9000000000T", " 2 TB "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Parse(%q): %v does not wrap ErrSyntax", s, err)
			}
			return
		}
		if v < 0 {
			t.Fatalf("Parse(%q) = %d", s, v)
		}
		if again, err := Parse(strconv.FormatInt(v, 10)); err != nil || again != v {
			t.Fatalf("Parse(%d) = %d, %v", v, again, err)
		}
	})
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		2 << 20: "2.0 MiB", 5 << 29: "2.5 GiB", 3 << 40: "3.0 TiB", 1 << 62: "4.0 EiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}
