//go:build !kvfs_nocuda

package cuda

import (
	"fmt"
	"os"

	"github.com/ebitengine/purego"
)

// libNames are tried in order; KVFS_LIBCUDA overrides (a path or a name).
var libNames = []string{"libcuda.so.1", "libcuda.so"}

func openDriver() (uintptr, error) {
	names := libNames
	if p := os.Getenv("KVFS_LIBCUDA"); p != "" {
		names = []string{p}
	}
	var firstErr error
	for _, n := range names {
		h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return 0, fmt.Errorf("%w: %v", ErrNoDriver, firstErr)
}

// bind resolves name in lib and stores it in fptr (a pointer to a func
// variable). A missing symbol leaves *fptr nil and returns false.
func bind(lib uintptr, fptr any, name string) bool {
	sym, err := purego.Dlsym(lib, name)
	if err != nil || sym == 0 {
		return false
	}
	purego.RegisterFunc(fptr, sym)
	return true
}
