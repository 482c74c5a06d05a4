// Package bytesize parses the byte counts people type: 4096, 64KiB, 256MiB,
// 4GiB, 1g, 512k. Units are binary (k = KiB = 1024); case and a trailing
// "b" or "ib" do not matter. It is the one size parser of the command line
// (--size, --io-size, --read-ahead) and of the requests files of kvfs load
// (package client), which is why it is not in either; Format writes sizes
// for people the same way (the CLI, progress lines).
package bytesize

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrSyntax is wrapped by every error of Parse.
var ErrSyntax = errors.New("bytesize: invalid size")

// Parse parses a size such as 4096, 256MiB, 4GiB, 1G or 512k. It refuses
// negative numbers, unknown units and sizes that overflow an int64.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("%w: %q has no number", ErrSyntax, s)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: %v", ErrSyntax, s, err)
	}
	var shift uint
	switch strings.ToLower(strings.TrimSpace(t[i:])) {
	case "", "b":
	case "k", "kb", "kib":
		shift = 10
	case "m", "mb", "mib":
		shift = 20
	case "g", "gb", "gib":
		shift = 30
	case "t", "tb", "tib":
		shift = 40
	default:
		return 0, fmt.Errorf("%w: %q has an unknown unit", ErrSyntax, s)
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%w: %q overflows", ErrSyntax, s)
	}
	return n << shift, nil
}

// Format writes n with a binary unit and one decimal: "512 B", "1.0 KiB",
// "2.5 GiB" (up to EiB).
func Format(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
