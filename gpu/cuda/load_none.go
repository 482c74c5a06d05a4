//go:build kvfs_nocuda

package cuda

import "fmt"

func openDriver() (uintptr, error) {
	return 0, fmt.Errorf("%w: built with kvfs_nocuda", ErrNoDriver)
}

func bind(lib uintptr, fptr any, name string) bool { return false }
