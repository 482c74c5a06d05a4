package nvme

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func TestURingCmdNumbers(t *testing.T) {
	// _IOWR('N', nr, 72): dir 3 << 30 | size << 16 | 'N' << 8 | nr.
	iowr := func(nr uint32) uint32 { return 3<<30 | CmdSize<<16 | 'N'<<8 | nr }
	for _, c := range []struct {
		name string
		got  uint32
		want uint32
	}{
		{"NVME_URING_CMD_IO", URingCmdIO, iowr(0x80)},
		{"NVME_URING_CMD_IO_VEC", URingCmdIOVec, iowr(0x81)},
		{"NVME_URING_CMD_ADMIN", URingCmdAdmin, iowr(0x82)},
		{"NVME_URING_CMD_ADMIN_VEC", URingCmdAdminVec, iowr(0x83)},
		{"NVME_IOCTL_ADMIN_CMD", ioctlAdminCmd, iowr(0x41)},
		{"NVME_IOCTL_IO_CMD", ioctlIOCmd, iowr(0x43)},
		{"NVME_IOCTL_ID", ioctlID, 'N'<<8 | 0x40},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if URingCmdIO != 0xC0484E80 {
		t.Fatalf("NVME_URING_CMD_IO = %#x", URingCmdIO)
	}
}

func TestWriteCmdFields(t *testing.T) {
	c, err := WriteCmd(RW{NSID: 1, SLBA: 0x1_2345_6789, NLB: 8, Addr: 0xdead000, Len: 32768, FUA: true, DType: DTypePlacement, DSpec: 5})
	if err != nil {
		t.Fatal(err)
	}
	var b [CmdSize]byte
	c.Encode(b[:])
	le := binary.LittleEndian
	for _, f := range []struct {
		name      string
		got, want uint64
	}{
		{"opcode", uint64(b[0]), 0x01},
		{"nsid", uint64(le.Uint32(b[4:])), 1},
		{"addr", le.Uint64(b[24:]), 0xdead000},
		{"data_len", uint64(le.Uint32(b[36:])), 32768},
		{"cdw10 slba low", uint64(le.Uint32(b[40:])), 0x2345_6789},
		{"cdw11 slba high", uint64(le.Uint32(b[44:])), 1},
		{"cdw12", uint64(le.Uint32(b[48:])), 7 | 1<<30 | 2<<20},
		{"cdw13", uint64(le.Uint32(b[52:])), 5 << 16},
	} {
		if f.got != f.want {
			t.Errorf("%s = %#x, want %#x", f.name, f.got, f.want)
		}
	}
	back, err := DecodeCommand(b[:])
	if err != nil || back != c {
		t.Fatalf("round trip: %+v, %v; want %+v", back, err, c)
	}
}

func TestReadCmdDropsDirective(t *testing.T) {
	c, err := ReadCmd(RW{NSID: 1, SLBA: 10, NLB: 1, DType: DTypePlacement, DSpec: 3})
	if err != nil {
		t.Fatal(err)
	}
	if c.Opcode != OpRead || c.CDW12 != 0 || c.CDW13 != 0 || c.CDW10 != 10 {
		t.Fatalf("read command %+v", c)
	}
}

func TestRWLimits(t *testing.T) {
	if _, err := WriteCmd(RW{NLB: 0}); !errors.Is(err, ErrInvalidCommand) {
		t.Errorf("NLB 0: %v", err)
	}
	if _, err := WriteCmd(RW{NLB: maxNLB + 1}); !errors.Is(err, ErrInvalidCommand) {
		t.Errorf("NLB 65537: %v", err)
	}
	c, err := WriteCmd(RW{NLB: maxNLB})
	if err != nil || c.CDW12 != 0xFFFF {
		t.Errorf("NLB 65536: cdw12 %#x, %v", c.CDW12, err)
	}
	if _, err := DecodeCommand(make([]byte, CmdSize-1)); !errors.Is(err, ErrShort) {
		t.Errorf("short command: %v", err)
	}
}

func TestAdminCmds(t *testing.T) {
	f := FlushCmd(3)
	if f.Opcode != 0 || f.NSID != 3 {
		t.Errorf("flush %+v", f)
	}
	id := IdentifyCmd(CNSController, 0, 0x1000)
	if id.Opcode != AdminIdentify || id.CDW10 != 1 || id.DataLen != 4096 {
		t.Errorf("identify %+v", id)
	}
	// 64 KiB of log 20h for endurance group 1 from offset 0x1_0000_0008.
	lp := GetLogPageCmd(LogFDPConfigs, 1, 0, 0x1_0000_0008, 0, 65536)
	if lp.CDW10 != 0x20|0x3FFF<<16 || lp.CDW11 != 1<<16 || lp.CDW12 != 8 || lp.CDW13 != 1 {
		t.Errorf("get log page %+v", lp)
	}
	// NUMD above 16 bits spills into NUMDU.
	big := GetLogPageCmd(LogFDPConfigs, 2, 0, 0, 0, 1<<20)
	if big.CDW10>>16 != 0xFFFF || big.CDW11 != 3|2<<16 {
		t.Errorf("get log page 1 MiB %+v", big)
	}
	gf := GetFeaturesCmd(FeatureFDP, 0, 1)
	if gf.CDW10 != 0x1D || gf.CDW11 != 1 {
		t.Errorf("get features %+v", gf)
	}
	rs := IOMgmtRecvCmd(IOMgmtRUHS, 1, 0, 4096)
	if rs.Opcode != 0x12 || rs.CDW10 != 1 || rs.CDW11 != 1023 {
		t.Errorf("io mgmt recv %+v", rs)
	}
	if ft := DecodeFDPFeature(0x0301); !ft.Enabled || ft.ConfigIndex != 3 {
		t.Errorf("fdp feature %+v", ft)
	}
}

func TestStatusError(t *testing.T) {
	cases := []struct {
		st    Status
		is    error
		isnt  error
		dnr   bool
		inMsg string
	}{
		{0x4281, ErrMedia, ErrPath, true, "unrecovered read error"},
		{0x0080, ErrRange, ErrMedia, false, "LBA out of range"},
		{0x4002, ErrInvalidCommand, ErrRange, true, "invalid field"},
		{0x0370, ErrPath, ErrMedia, false, "host pathing error"},
		{0x0004, ErrMedia, ErrPath, false, "data transfer error"},
	}
	for _, c := range cases {
		var err error = &StatusError{Opcode: OpRead, Status: c.st}
		if !errors.Is(err, c.is) || errors.Is(err, c.isnt) {
			t.Errorf("%#x: is %v %v, isnt %v %v", uint16(c.st), c.is, errors.Is(err, c.is), c.isnt, errors.Is(err, c.isnt))
		}
		se := err.(*StatusError)
		if se.Status.DNR() != c.dnr || se.Temporary() == c.dnr {
			t.Errorf("%#x: dnr %v", uint16(c.st), se.Status.DNR())
		}
		if msg := err.Error(); !strings.Contains(msg, c.inMsg) || !strings.Contains(msg, "read") {
			t.Errorf("%#x: message %q", uint16(c.st), msg)
		}
	}
	s := Status(0x2000 | 0x1800 | 0x0281)
	if !s.More() || s.CRD() != 3 || s.SCT() != 2 || s.SC() != 0x81 {
		t.Errorf("decode %#x: more %v crd %d sct %d sc %#x", uint16(s), s.More(), s.CRD(), s.SCT(), s.SC())
	}
	if n := statusName(0x07AB); n != "vendor specific" {
		t.Errorf("vendor status name %q", n)
	}
}
