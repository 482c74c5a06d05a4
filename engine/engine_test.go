package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvfs/kvfs/engine/posix"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/uring"
)

// named is an in-memory engine that answers to a backend's name.
type named struct {
	*storetest.Mem
	name   string
	closed *int
}

func (n named) Name() string { return n.name }
func (n named) Close() error {
	if n.closed != nil {
		*n.closed++
	}
	return nil
}

// fake describes one stand-in backend: its probe and open outcomes.
type fake struct {
	kind              string
	probeErr, openErr error
}

// useFakes replaces the backend table for the test and records which
// kinds were opened.
func useFakes(t *testing.T, fakes ...fake) *[]string {
	t.Helper()
	saved := backends
	t.Cleanup(func() { backends = saved })
	var opened []string
	backends = nil
	for _, f := range fakes {
		backends = append(backends, backend{
			kind:  f.kind,
			probe: func(string) error { return f.probeErr },
			open: func(string, Options) (store.Engine, error) {
				if f.openErr != nil {
					return nil, f.openErr
				}
				opened = append(opened, f.kind)
				return named{Mem: storetest.NewMem(1<<20, 512), name: f.kind}, nil
			},
		})
	}
	return &opened
}

func observed() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(core), logs
}

func TestAutoFallback(t *testing.T) {
	notNVMe := errors.New("not an NVMe namespace")
	noUring := errors.New("io_uring disabled by sysctl")
	ringFail := errors.New("ring setup: ENOMEM")
	cases := []struct {
		name    string
		fakes   []fake
		want    string
		reasons []string // one log line per kind passed over, in order
	}{
		{"nvme first", []fake{{KindNVMe, nil, nil}, {KindUring, nil, nil}, {KindPosix, nil, nil}}, KindNVMe, nil},
		{"uring when not nvme", []fake{{KindNVMe, notNVMe, nil}, {KindUring, nil, nil}, {KindPosix, nil, nil}}, KindUring,
			[]string{"not using nvme: " + notNVMe.Error()}},
		{"posix when uring unavailable", []fake{{KindNVMe, notNVMe, nil}, {KindUring, noUring, nil}, {KindPosix, nil, nil}}, KindPosix,
			[]string{"not using nvme: " + notNVMe.Error(), "not using uring: " + noUring.Error()}},
		{"posix when uring fails to open", []fake{{KindNVMe, notNVMe, nil}, {KindUring, nil, ringFail}, {KindPosix, nil, nil}}, KindPosix,
			[]string{"not using nvme: " + notNVMe.Error(), "not using uring: " + ringFail.Error()}},
		{"uring when nvme fails to open", []fake{{KindNVMe, nil, ringFail}, {KindUring, nil, nil}, {KindPosix, nil, nil}}, KindUring,
			[]string{"not using nvme: " + ringFail.Error()}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opened := useFakes(t, c.fakes...)
			log, logs := observed()
			for _, kind := range []string{"", "auto", "AUTO"} {
				logs.TakeAll()
				e, err := Open("/dev/whatever", Options{Kind: kind, Logger: log})
				if err != nil {
					t.Fatalf("kind %q: %v", kind, err)
				}
				if e.Name() != c.want {
					t.Errorf("kind %q: opened %s, want %s", kind, e.Name(), c.want)
				}
				lines := logs.FilterMessageSnippet("not using").All()
				if len(lines) != len(c.reasons) {
					t.Fatalf("kind %q: %d fallback lines, want %d: %v", kind, len(lines), len(c.reasons), lines)
				}
				for i, l := range lines {
					msg, want, _ := strings.Cut(c.reasons[i], ": ")
					reason, _ := l.ContextMap()["reason"].(string)
					if l.Level != zapcore.InfoLevel || l.Message != "engine: "+msg || !strings.HasSuffix(reason, want) {
						t.Errorf("kind %q: line %d: %v %q reason %q; want %q", kind, i, l.Level, l.Message, reason, c.reasons[i])
					}
				}
			}
			if n := len(*opened); n != 3 {
				t.Errorf("opened %d engines, want one per call", n)
			}
		})
	}
}

func TestExplicitKindDoesNotFallBack(t *testing.T) {
	noUring := errors.New("io_uring disabled by sysctl")
	opened := useFakes(t, fake{KindNVMe, nil, nil}, fake{KindUring, noUring, nil}, fake{KindPosix, nil, nil})
	_, err := Open("f", Options{Kind: "uring"})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, noUring) {
		t.Fatalf("err = %v, want ErrUnavailable wrapping the probe's reason", err)
	}
	if len(*opened) != 0 {
		t.Errorf("opened %v after an explicit kind failed", *opened)
	}
	e, err := Open("f", Options{Kind: "posix"})
	if err != nil || e.Name() != KindPosix {
		t.Fatalf("posix: %v, %v", e, err)
	}
}

func TestAllFail(t *testing.T) {
	boom := errors.New("boom")
	useFakes(t, fake{KindNVMe, boom, nil}, fake{KindUring, boom, nil}, fake{KindPosix, nil, boom})
	if _, err := Open("f", Options{}); err == nil || !errors.Is(err, boom) {
		t.Fatalf("err = %v, want every reason joined", err)
	}
}

func TestParseKind(t *testing.T) {
	for in, want := range map[string]string{"": KindAuto, "auto": KindAuto, " Posix ": KindPosix, "uring": KindUring, "NVMe": KindNVMe} {
		if got, err := ParseKind(in); err != nil || got != want {
			t.Errorf("ParseKind(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"spdk", "posix,uring"} {
		if _, err := ParseKind(bad); !errors.Is(err, ErrKind) {
			t.Errorf("ParseKind(%q) err = %v, want ErrKind", bad, err)
		}
		if _, err := Open("f", Options{Kind: bad}); !errors.Is(err, ErrKind) {
			t.Errorf("Open kind %q err = %v, want ErrKind", bad, err)
		}
	}
}

// A store file is never an NVMe namespace; auto opens it with a real engine
// and says why nvme was passed over.
func TestRealAutoOnFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	if err := store.PrepareFile(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := probeNVMe(path); err == nil || !strings.Contains(err.Error(), "not a device") {
		t.Errorf("probeNVMe(file) = %v", err)
	}
	log, logs := observed()
	e, err := Open(path, Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	want := KindUring
	if uring.Available() != nil {
		want = KindPosix
		if l := logs.FilterMessage("engine: not using uring").All(); len(l) != 1 {
			t.Errorf("uring fallback lines: %v", logs.All())
		}
	}
	if e.Name() != want {
		t.Errorf("auto opened %q, want %q (uring.Available: %v)", e.Name(), want, uring.Available())
	}
	if l := logs.FilterMessage("engine: not using nvme").All(); len(l) != 1 {
		t.Errorf("nvme fallback lines: %v", logs.All())
	}
	if _, err := Open(path, Options{Kind: KindNVMe}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("nvme on a file: %v, want ErrUnavailable", err)
	}
}

var testGeo = layout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 4096}

func formatFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	if err := store.PrepareFile(path, store.SizeFor(testGeo, 4)); err != nil {
		t.Fatal(err)
	}
	e, err := posix.Open(path, posix.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := store.Format(e, testGeo, store.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestOpenStore(t *testing.T) {
	path := formatFile(t)
	s, closeAll, err := OpenStore(path, Options{Kind: KindPosix}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Geometry() != testGeo || s.Engine().Name() != KindPosix {
		t.Errorf("opened %v on %s", s.Geometry(), s.Engine().Name())
	}
	// A second opener, as another process would, is told why.
	_, _, err = OpenStore(path, Options{}, store.Options{})
	var le *LockedError
	if !errors.Is(err, store.ErrLocked) || !errors.As(err, &le) ||
		!strings.Contains(err.Error(), "in use by another process (is it mounted?)") {
		t.Fatalf("second open: %v", err)
	}
	if err := closeAll(); err != nil {
		t.Fatal(err)
	}
	if err := closeAll(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	// Everything is released: the lock can be taken again.
	f, err := store.Lock(path)
	if err != nil {
		t.Fatalf("lock after close: %v", err)
	}
	f.Close()
}

func TestOpenStoreFailureReleasesLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenStore(path, Options{Kind: KindPosix}, store.Options{}); !errors.Is(err, store.ErrNoStore) {
		t.Fatalf("err = %v, want ErrNoStore", err)
	}
	if _, _, err := OpenStore(path, Options{Kind: "spdk"}, store.Options{}); !errors.Is(err, ErrKind) {
		t.Fatalf("err = %v, want ErrKind", err)
	}
	f, err := store.Lock(path)
	if err != nil {
		t.Fatalf("lock left held: %v", err)
	}
	f.Close()
}

// TestClosedEngines: every real engine that opens here answers the one
// error contract: a second Close returns nil, and Do and Sync after Close
// wrap store.ErrEngineClosed with the engine's own prefix.
func TestClosedEngines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	if err := store.PrepareFile(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{KindPosix, KindUring} {
		t.Run(kind, func(t *testing.T) {
			e, err := Open(path, Options{Kind: kind})
			if errors.Is(err, ErrUnavailable) {
				t.Skipf("skipping: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if err := e.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			buf := make([]byte, 4096)
			err = e.Do([]store.IO{{Op: store.OpRead, Buf: buf}})
			if !errors.Is(err, store.ErrEngineClosed) || !strings.HasPrefix(err.Error(), kind+": ") {
				t.Errorf("Do after Close: %v, want %q-prefixed store.ErrEngineClosed", err, kind)
			}
			if err := e.Sync(); !errors.Is(err, store.ErrEngineClosed) {
				t.Errorf("Sync after Close: %v", err)
			}
		})
	}
}
