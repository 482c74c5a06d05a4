package nvme

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

var le = binary.LittleEndian

// identifyCtrl builds an Identify Controller page like QEMU's.
func identifyCtrl(mdts uint8, ctratt uint32) []byte {
	b := make([]byte, IdentifySize)
	le.PutUint16(b[0:], 0x1b36)
	copy(b[4:24], "kvfs-test-serial    ")
	copy(b[24:64], "QEMU NVMe Ctrl                          ")
	copy(b[64:72], "10.0.2  ")
	b[77] = mdts
	le.PutUint16(b[78:], 7)
	le.PutUint32(b[80:], 0x20000)
	le.PutUint32(b[96:], ctratt)
	le.PutUint32(b[516:], 256)
	b[525] = 1
	copy(b[768:], "nqn.2019-08.org.qemu:subsys0")
	return b
}

// identifyNS builds an Identify Namespace page with formats of (lbads, ms).
func identifyNS(nsze uint64, flbas uint8, endgid uint16, formats ...[2]int) []byte {
	b := make([]byte, IdentifySize)
	le.PutUint64(b[0:], nsze)
	le.PutUint64(b[8:], nsze)
	b[25] = uint8(len(formats) - 1)
	b[26] = flbas
	le.PutUint16(b[102:], endgid)
	for i, f := range formats {
		le.PutUint32(b[128+4*i:], uint32(f[1])|uint32(f[0])<<16)
	}
	return b
}

func TestDecodeController(t *testing.T) {
	c, err := DecodeController(identifyCtrl(7, CtrattFDP|CtrattEnduranceGroups))
	if err != nil {
		t.Fatal(err)
	}
	if c.Serial != "kvfs-test-serial" || c.Model != "QEMU NVMe Ctrl" || c.Firmware != "10.0.2" {
		t.Errorf("strings %q %q %q", c.Serial, c.Model, c.Firmware)
	}
	if !c.FDP() || c.MaxTransfer() != 512<<10 || !c.VolatileWriteCache() || c.NN != 256 || c.CNTLID != 7 {
		t.Errorf("controller %+v", c)
	}
	if c.SubNQN != "nqn.2019-08.org.qemu:subsys0" {
		t.Errorf("subnqn %q", c.SubNQN)
	}
	c, _ = DecodeController(identifyCtrl(0, 0))
	if c.FDP() || c.MaxTransfer() != 0 {
		t.Errorf("no fdp, no mdts: %+v", c)
	}
	if _, err := DecodeController(make([]byte, 100)); !errors.Is(err, ErrShort) {
		t.Errorf("short: %v", err)
	}
}

func TestDecodeNamespace(t *testing.T) {
	// QEMU's list: 512, 512+8, 512+16, 512+64, 4096, 4096+8, 4096+16, 4096+64.
	fmts := [][2]int{{9, 0}, {9, 8}, {9, 16}, {9, 64}, {12, 0}, {12, 8}, {12, 16}, {12, 64}}
	n, err := DecodeNamespace(identifyNS(1<<18, 4, 1, fmts...))
	if err != nil {
		t.Fatal(err)
	}
	if n.NLBAF != 8 || n.FormatIndex != 4 || n.LBASize() != 4096 || n.Size() != 1<<30 || n.ENDGID != 1 {
		t.Errorf("namespace %+v", n)
	}
	n, err = DecodeNamespace(identifyNS(100, 0x10|1, 0, fmts...))
	if err != nil {
		t.Fatal(err)
	}
	if !n.ExtendedMeta || n.LBASize() != 520 || n.Format().MetaSize != 8 || n.Size() != 51200 {
		t.Errorf("extended metadata: %+v lba %d", n, n.LBASize())
	}
	// FLBAS bits 6:5 are the high bits of the index.
	many := make([][2]int, 20)
	for i := range many {
		many[i] = [2]int{9, 0}
	}
	many[17] = [2]int{13, 0}
	if n, err = DecodeNamespace(identifyNS(8, 1<<5|1, 0, many...)); err != nil || n.FormatIndex != 17 || n.LBASize() != 8192 {
		t.Errorf("format index 17: %+v %v", n, err)
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", make([]byte, 4095), ErrShort},
		{"index past count", identifyNS(8, 2, 0, [2]int{9, 0}), ErrFormat},
		{"lbads 0", identifyNS(8, 0, 0, [2]int{0, 0}), ErrFormat},
		{"empty", identifyNS(0, 0, 0, [2]int{9, 0}), ErrFormat},
		{"huge", identifyNS(1<<60, 0, 0, [2]int{12, 0}), ErrFormat},
	} {
		if _, err := DecodeNamespace(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// fdpConfigsLog builds a log page 20h with one descriptor per nruh entry.
func fdpConfigsLog(nruhs ...int) []byte {
	b := make([]byte, fdpConfsHeaderSize)
	le.PutUint16(b[0:], uint16(len(nruhs)-1))
	for _, nruh := range nruhs {
		d := make([]byte, fdpDescrHeaderSize+4*nruh)
		le.PutUint16(d[0:], uint16(len(d)))
		d[2] = 0x80
		le.PutUint32(d[4:], 1)
		le.PutUint16(d[8:], uint16(nruh))
		le.PutUint16(d[10:], uint16(nruh-1))
		le.PutUint32(d[12:], 1)
		le.PutUint64(d[16:], 96<<20)
		for h := 0; h < nruh; h++ {
			d[fdpDescrHeaderSize+4*h] = 1
		}
		b = append(b, d...)
	}
	le.PutUint32(b[4:], uint32(len(b)))
	return append(b, make([]byte, 100)...) // trailing buffer space is ignored
}

func TestDecodeFDPConfigs(t *testing.T) {
	cfgs, err := DecodeFDPConfigs(fdpConfigsLog(8, 2))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfgs) != 2 {
		t.Fatalf("%d configs", len(cfgs))
	}
	c := cfgs[0]
	if !c.Valid || c.NRG != 1 || c.NRUH != 8 || c.MaxPIDs != 8 || c.RUNS != 96<<20 || len(c.HandleTypes) != 8 || c.HandleTypes[7] != RUHInitiallyIsolated {
		t.Errorf("config 0 %+v", c)
	}
	if cfgs[1].NRUH != 2 {
		t.Errorf("config 1 %+v", cfgs[1])
	}
	bad := fdpConfigsLog(8)
	le.PutUint16(bad[fdpConfsHeaderSize:], 10) // descriptor smaller than its header
	if _, err := DecodeFDPConfigs(bad); !errors.Is(err, ErrFormat) {
		t.Errorf("small descriptor: %v", err)
	}
	bad = fdpConfigsLog(8)
	le.PutUint16(bad[0:], 5) // six configs announced, one present
	if _, err := DecodeFDPConfigs(bad); !errors.Is(err, ErrFormat) {
		t.Errorf("missing descriptors: %v", err)
	}
	bad = fdpConfigsLog(8)
	le.PutUint32(bad[4:], 1<<30)
	if _, err := DecodeFDPConfigs(bad); !errors.Is(err, ErrFormat) {
		t.Errorf("huge size: %v", err)
	}
	if _, err := DecodeFDPConfigs(fdpConfigsLog(8)[:40]); !errors.Is(err, ErrShort) {
		t.Errorf("truncated: %v", err)
	}
}

func ruhStatus(ruamw ...uint64) []byte {
	b := make([]byte, RUHStatusSize(len(ruamw)))
	le.PutUint16(b[14:], uint16(len(ruamw)))
	for i, v := range ruamw {
		d := b[ruhsHeaderSize+ruhsDescrSize*i:]
		le.PutUint16(d[0:], uint16(i))
		le.PutUint16(d[2:], uint16(i))
		le.PutUint64(d[8:], v)
	}
	return b
}

func TestDecodeRUHStatus(t *testing.T) {
	h, err := DecodeRUHStatus(ruhStatus(24576, 24575, 100))
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 3 || h[1].PID != 1 || h[1].RUHID != 1 || h[1].RUAMW != 24575 {
		t.Errorf("status %+v", h)
	}
	if _, err := DecodeRUHStatus(ruhStatus(1, 2)[:60]); !errors.Is(err, ErrShort) {
		t.Errorf("truncated: %v", err)
	}
	if h, err := DecodeRUHStatus(make([]byte, 16)); err != nil || len(h) != 0 {
		t.Errorf("empty: %v %v", h, err)
	}
}

func TestPlacement(t *testing.T) {
	p := Placement{PIDs: []uint16{0, 1, 2, 3, 4, 5, 6, 7}}
	if p.PID(0) != 0 {
		t.Errorf("meta on %d", p.PID(0))
	}
	for s := uint16(1); s <= 7; s++ {
		if p.PID(s) != s || p.Handle(s) != int(s) {
			t.Errorf("stream %d on %d", s, p.PID(s))
		}
	}
	p = Placement{PIDs: []uint16{10, 11, 12}}
	want := map[uint16]uint16{0: 10, 1: 11, 2: 12, 3: 11, 4: 12, 7: 11}
	for s, pid := range want {
		if p.PID(s) != pid {
			t.Errorf("3 handles: stream %d on %d, want %d", s, p.PID(s), pid)
		}
	}
	one := Placement{PIDs: []uint16{4}}
	if one.PID(0) != 4 || one.PID(5) != 4 || (Placement{}).PID(3) != 0 {
		t.Errorf("single/no handle")
	}
}

func TestComputeMaxTransfer(t *testing.T) {
	for _, c := range []struct {
		l    Limits
		lba  int
		want int64
	}{
		{Limits{MDTSBytes: 512 << 10, MaxHWSectorsKB: 512, MaxSegments: 127}, 4096, 126 * 4096},
		{Limits{MDTSBytes: 512 << 10, MaxHWSectorsKB: 256, MaxSegments: 1024}, 4096, 256 << 10},
		{Limits{MDTSBytes: 128 << 10}, 4096, 128 << 10},
		{Limits{}, 512, 128 << 10},
		{Limits{MDTSBytes: 1 << 40}, 512, 32 << 20},           // 65536 blocks of 512
		{Limits{MDTSBytes: 1 << 40}, 65536, 1 << 30},          // capped at 1 GiB
		{Limits{MaxHWSectorsKB: 3}, 4096, 4096},               // never below one block
		{Limits{MDTSBytes: 10000}, 4096, 8192},                // rounded to blocks
		{Limits{MaxSegments: 1, MDTSBytes: 8192}, 4096, 8192}, // 1 segment: no page math
	} {
		if got := computeMaxTransfer(c.l, c.lba, 4096); got != c.want {
			t.Errorf("%+v lba %d: %d, want %d", c.l, c.lba, got, c.want)
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	for _, c := range []struct {
		rel  string
		want bool
	}{
		{"6.18.44-fc-v1045", true}, {"5.19.0", true}, {"5.18.17-arch1", false}, {"4.19.0-27-amd64", false},
		{"6.1.0-13-amd64", true}, {"weird", true}, {"5.4", false},
	} {
		if got := KernelAtLeast(c.rel, 5, 19); got != c.want {
			t.Errorf("%q: %v", c.rel, got)
		}
	}
}

func TestCharDevice(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f, dir, filepath.Join(dir, "missing")} {
		if _, err := CharDevice(p); !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrNotCharDevice) {
			t.Errorf("%s: %v", p, err)
		}
		if err := Available(p); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Available(%s) = %v", p, err)
		}
	}
	if p, err := CharDevice("/dev/null"); err != nil || p != "/dev/null" {
		t.Errorf("/dev/null: %q %v", p, err)
	}
	// A char device that is not NVMe fails at NVME_IOCTL_ID.
	if err := Available("/dev/null"); !errors.Is(err, ErrNotNVMe) {
		t.Errorf("Available(/dev/null) = %v", err)
	}
}

func TestFDPInfoString(t *testing.T) {
	off := &FDPInfo{Reason: "controller does not support FDP"}
	if got := off.String(); got != "fdp: off (controller does not support FDP)" {
		t.Errorf("off: %q", got)
	}
	cfgs, _ := DecodeFDPConfigs(fdpConfigsLog(2))
	h, _ := DecodeRUHStatus(ruhStatus(10, 20))
	on := &FDPInfo{Enabled: true, EnduranceGroup: 1, Config: &cfgs[0], Handles: h, LBASize: 4096}
	want := "fdp: on, endurance group 1, configuration 0: 2 handles, 1 reclaim groups, reclaim unit 96 MiB\n" +
		"  handle 0 (pid 0, ruh 0, meta): 40960 bytes available in its reclaim unit\n" +
		"  handle 1 (pid 1, ruh 1, data): 81920 bytes available in its reclaim unit"
	if got := on.String(); got != want {
		t.Errorf("on:\n%s\nwant\n%s", got, want)
	}
}
