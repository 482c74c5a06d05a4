package nvme

import (
	"errors"
	"testing"
)

// Every decoder of device-returned bytes must return an error wrapping
// ErrShort or ErrFormat, or a value whose invariants hold; never panic.

func checkDecodeErr(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrShort) && !errors.Is(err, ErrFormat) {
		t.Fatalf("error %v wraps neither ErrShort nor ErrFormat", err)
	}
}

func FuzzDecodeController(f *testing.F) {
	f.Add(identifyCtrl(7, CtrattFDP))
	f.Add(identifyCtrl(0, 0))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeController(b)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if m := c.MaxTransfer(); m < 0 || (m != 0 && m < 8192) {
			t.Fatalf("max transfer %d", m)
		}
	})
}

func FuzzDecodeNamespace(f *testing.F) {
	f.Add(identifyNS(1<<18, 4, 1, [2]int{9, 0}, [2]int{9, 8}, [2]int{9, 16}, [2]int{9, 64}, [2]int{12, 0}))
	f.Add(identifyNS(100, 0x11, 0, [2]int{9, 0}, [2]int{9, 8}))
	f.Add(make([]byte, 10))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := DecodeNamespace(b)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if n.FormatIndex < 0 || n.FormatIndex >= len(n.Formats) || len(n.Formats) != n.NLBAF {
			t.Fatalf("format index %d of %d", n.FormatIndex, len(n.Formats))
		}
		if n.LBASize() < 512 || n.Size() <= 0 {
			t.Fatalf("lba size %d, size %d", n.LBASize(), n.Size())
		}
	})
}

func FuzzDecodeFDPConfigs(f *testing.F) {
	f.Add(fdpConfigsLog(8))
	f.Add(fdpConfigsLog(8, 2, 1))
	f.Add(fdpConfigsLog(1)[:20])
	f.Fuzz(func(t *testing.T, b []byte) {
		cfgs, err := DecodeFDPConfigs(b)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if len(cfgs) == 0 || len(cfgs) > 65536 {
			t.Fatalf("%d configs", len(cfgs))
		}
		for _, c := range cfgs {
			if len(c.HandleTypes) != int(c.NRUH) || c.MaxPIDs < 1 {
				t.Fatalf("config %+v", c)
			}
		}
	})
}

func FuzzDecodeRUHStatus(f *testing.F) {
	f.Add(ruhStatus(24576, 24575, 100))
	f.Add(ruhStatus())
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeRUHStatus(b)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if RUHStatusSize(len(h)) > len(b) {
			t.Fatalf("%d descriptors from %d bytes", len(h), len(b))
		}
	})
}

func FuzzCommandRoundTrip(f *testing.F) {
	var b [CmdSize]byte
	c, _ := WriteCmd(RW{NSID: 1, SLBA: 77, NLB: 8, DType: DTypePlacement, DSpec: 3})
	c.Encode(b[:])
	f.Add(b[:])
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := DecodeCommand(in)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		var out [CmdSize]byte
		c.Encode(out[:])
		if string(out[:]) != string(in[:CmdSize]) {
			t.Fatalf("round trip changed the command")
		}
	})
}
