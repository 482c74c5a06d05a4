package abi

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// layoutField is one field of a struct as Go lays it out.
type layoutField struct {
	cStruct, cField string
	off, size       uintptr
}

// goLayout lists every field of the ABI structs with its Go offset and size.
// Field names map to C by lower-casing with underscores (see cName).
func goLayout() []layoutField {
	var fs []layoutField
	add := func(cStruct string, v any) {
		t := reflect.TypeOf(v)
		fs = append(fs, layoutField{cStruct, "", 0, t.Size()})
		for i := range t.NumField() {
			f := t.Field(i)
			fs = append(fs, layoutField{cStruct, cName(f.Name), f.Offset, f.Type.Size()})
		}
	}
	add("kvfs_info", Info{})
	add("kvfs_register_host", RegisterHost{})
	add("kvfs_unregister", Unregister{})
	add("kvfs_register_fd", RegisterFD{})
	add("kvfs_batch_hdr", BatchHeader{})
	add("kvfs_entry", Entry{})
	add("kvfs_target_region", TargetRegion{})
	add("kvfs_target", Target{})
	add("kvfs_unregister_target", UnregisterTarget{})
	add("kvfs_blocks", Blocks{})
	add("kvfs_block_entry", BlockEntry{})
	add("kvfs_block_entry_tagged", BlockEntryTagged{})
	add("kvfs_lookup", LookupHeader{})
	add("kvfs_lookup_pair", LookupPair{})
	return fs
}

func cName(goName string) string {
	special := map[string]string{
		"ABI": "abi", "KVHeads": "kv_heads", "DType": "dtype", "DTypeBytes": "dtype_bytes",
		"NOK": "n_ok", "UUID": "uuid", "MaxRegisteredBytes": "max_registered_bytes",
		"FD": "fd", "MaxPinnedPerUID": "max_pinned_per_uid", "ABIMinor": "abi_minor", "GroupsOK": "groups_ok",
		"BlockEntry": "entry",
	}
	if s, ok := special[goName]; ok {
		return s
	}
	var b strings.Builder
	for i, r := range goName {
		if r >= 'A' && r <= 'Z' {
			if i > 0 && !(goName[i-1] >= '0' && goName[i-1] <= '9') {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestGoLayout(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uintptr
		want int
	}{
		{"Info", unsafe.Sizeof(Info{}), InfoSize},
		{"RegisterHost", unsafe.Sizeof(RegisterHost{}), RegisterHostSize},
		{"Unregister", unsafe.Sizeof(Unregister{}), UnregisterSize},
		{"RegisterFD", unsafe.Sizeof(RegisterFD{}), RegisterFDSize},
		{"BatchHeader", unsafe.Sizeof(BatchHeader{}), BatchHeaderSize},
		{"Entry", unsafe.Sizeof(Entry{}), EntrySize},
		{"TargetRegion", unsafe.Sizeof(TargetRegion{}), RegionSize},
		{"Target", unsafe.Sizeof(Target{}), TargetSize},
		{"UnregisterTarget", unsafe.Sizeof(UnregisterTarget{}), UnregisterTargetSize},
		{"Blocks", unsafe.Sizeof(Blocks{}), BlocksSize},
		{"BlockEntry", unsafe.Sizeof(BlockEntry{}), BlockEntrySize},
		{"BlockEntryTagged", unsafe.Sizeof(BlockEntryTagged{}), BlockEntryTaggedSize},
		{"LookupHeader", unsafe.Sizeof(LookupHeader{}), LookupSize},
		{"LookupPair", unsafe.Sizeof(LookupPair{}), LookupPairSize},
	} {
		if int(c.got) != c.want {
			t.Errorf("sizeof %s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if BatchMax != 511 || BatchSize != 16368 || BatchSmallSz != 2032 || BatchSize > MaxIoctlSize {
		t.Fatalf("batch sizes %d %d %d", BatchMax, BatchSize, BatchSmallSz)
	}
	if unsafe.Offsetof(Entry{}.Status) != EntryStatusOff || unsafe.Offsetof(Entry{}.Detail) != EntryDetailOff ||
		unsafe.Offsetof(BatchHeader{}.NOK) != HeaderNOKOff ||
		unsafe.Offsetof(Target{}.Target) != TargetOutOff || unsafe.Offsetof(Blocks{}.NOK) != BlocksNOKOff ||
		unsafe.Offsetof(Blocks{}.Groups) != BlocksGroupsOff || unsafe.Offsetof(BlockEntry{}.Status) != BlockStatusOff ||
		unsafe.Offsetof(BlockEntry{}.Detail) != BlockDetailOff || unsafe.Offsetof(BlockEntry{}.GroupsOK) != BlockGroupsOKOff ||
		unsafe.Offsetof(Target{}.Regions) != TargetHeaderSize ||
		unsafe.Offsetof(LookupHeader{}.Present) != LookupPresentOff || unsafe.Offsetof(LookupHeader{}.Absent) != LookupAbsentOff ||
		unsafe.Offsetof(LookupHeader{}.Mismatch) != LookupMismatchOff || unsafe.Offsetof(LookupHeader{}.Run) != LookupRunOff ||
		unsafe.Offsetof(LookupPair{}.Status) != LookupStatusOff {
		t.Fatal("output field offsets")
	}
}

// TestMarshalOffsets checks that each Marshal writes each field at its Go
// (hence C) offset: fill every field with a distinct byte pattern through
// reflection, marshal, and compare with the struct's memory image (the
// host is little-endian; the encoders are byte-order independent).
func TestMarshalOffsets(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skip("memory image comparison assumes little-endian")
	}
	type marshaler interface{ Marshal([]byte) }
	for _, v := range []marshaler{&Info{}, &RegisterHost{}, &Unregister{}, &RegisterFD{}, &BatchHeader{}, &Entry{},
		&Target{}, &UnregisterTarget{}, &Blocks{}, &BlockEntry{}, &BlockEntryTagged{}, &LookupHeader{}, &LookupPair{}} {
		rv := reflect.ValueOf(v).Elem()
		size := rv.Type().Size()
		img := unsafe.Slice((*byte)(rv.Addr().UnsafePointer()), size)
		for i := range img {
			img[i] = byte(i*7 + 3)
		}
		b := make([]byte, size)
		v.Marshal(b)
		if !bytes.Equal(b, img) {
			t.Errorf("%T: Marshal differs from the memory image", v)
		}
		u := reflect.New(rv.Type())
		u.Interface().(interface{ Unmarshal([]byte) }).Unmarshal(b)
		if !reflect.DeepEqual(u.Elem().Interface(), rv.Interface()) {
			t.Errorf("%T: Unmarshal(Marshal(x)) != x", v)
		}
	}
}

// TestCHeader compiles a C program against include/kvfs.h that prints the
// size and offset of every field and the ioctl numbers, and compares them
// with Go's.
func TestCHeader(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	hdr, err := filepath.Abs("../../include/kvfs.h")
	if err != nil {
		t.Fatal(err)
	}
	fields := goLayout()
	var src strings.Builder
	fmt.Fprintf(&src, "#include <stdio.h>\n#include <stddef.h>\n#include %q\nint main(void) {\n", hdr)
	for _, f := range fields {
		if f.cField == "" {
			fmt.Fprintf(&src, "\tprintf(\"%s %%zu 0\\n\", sizeof(struct %s));\n", f.cStruct, f.cStruct)
			continue
		}
		fmt.Fprintf(&src, "\tprintf(\"%s.%s %%zu %%zu\\n\", sizeof(((struct %s *)0)->%s), offsetof(struct %s, %s));\n",
			f.cStruct, f.cField, f.cStruct, f.cField, f.cStruct, f.cField)
	}
	cmds := map[string]uint32{
		"KVFS_IOC_INFO": CmdInfo, "KVFS_IOC_REGISTER_HOST": CmdRegisterHost, "KVFS_IOC_UNREGISTER": CmdUnregister, "KVFS_IOC_REGISTER_FD": CmdRegisterFD, "KVFS_ABI_MINOR": Minor,
		"KVFS_IOC_LOAD": CmdLoad, "KVFS_IOC_STORE": CmdStore, "KVFS_IOC_LOAD_SMALL": CmdLoadSmall, "KVFS_IOC_STORE_SMALL": CmdStoreSmall,
		"KVFS_ABI_VERSION": Version, "KVFS_IOC_MAGIC": Magic, "KVFS_BATCH_MAX": BatchMax, "KVFS_BATCH_SMALL_MAX": BatchSmallMax,
		"sizeof(struct kvfs_batch)": BatchSize, "sizeof(struct kvfs_batch_small)": BatchSmallSz,
		"KVFS_CAP_HOST": uint32(CapHost), "KVFS_CAP_STORE": uint32(CapStore), "KVFS_CAP_PITCH": uint32(CapPitch),
		"KVFS_CAP_FIXED_BUFFERS": uint32(CapFixedBuffers), "KVFS_CAP_CUDA": uint32(CapCUDA),
		"KVFS_CAP_REGISTER_FD": uint32(CapRegisterFD), "KVFS_CAP_LIMITS": uint32(CapLimits), "KVFS_BAD_OVERLAP": uint32(BadOverlap),
		"KVFS_OK": uint32(OK), "KVFS_ABSENT": uint32(Absent), "KVFS_CORRUPT": uint32(Corrupt),
		"KVFS_BAD_REQUEST": uint32(BadRequest), "KVFS_IO_ERROR": uint32(IOError), "KVFS_NO_SPACE": uint32(NoSpace),
		"KVFS_BAD_NONE": uint32(BadNone), "KVFS_BAD_KEY": uint32(BadKey), "KVFS_BAD_BUFFER": uint32(BadBuffer),
		"KVFS_BAD_RANGE": uint32(BadRange), "KVFS_BAD_PITCH": uint32(BadPitch), "KVFS_BAD_RESERVED": uint32(BadReserved),
		"KVFS_CAP_BLOCKS": uint32(CapBlocks), "KVFS_IOC_REGISTER_TARGET": CmdRegisterTarget, "KVFS_IOC_UNREGISTER_TARGET": CmdUnregisterTarget,
		"KVFS_IOC_LOAD_BLOCKS": CmdLoadBlocks, "KVFS_IOC_STORE_BLOCKS": CmdStoreBlocks,
		"KVFS_IOC_LOAD_BLOCKS_INLINE": CmdLoadBlocksInline, "KVFS_IOC_STORE_BLOCKS_INLINE": CmdStoreBlocksInline,
		"KVFS_TARGET_MAX_REGIONS": TargetMaxRegions, "KVFS_TARGET_MAX_LAYERS": TargetMaxLayers,
		"KVFS_BLOCKS_MAX": BlocksMax, "KVFS_BLOCKS_INLINE_MAX": BlocksInlineMax,
		"sizeof(struct kvfs_blocks_inline)": BlocksInlineSize,
		"KVFS_KINDS_K":                      KindsK, "KVFS_KINDS_V": KindsV, "KVFS_KINDS_BOTH": KindsBoth,
		"KVFS_CAP_PREFIX": uint32(CapPrefix), "KVFS_BAD_PARENT": uint32(BadParent), "KVFS_BAD_META": uint32(BadMeta),
		"KVFS_TAG_MISMATCH": uint32(TagMismatch), "KVFS_BLOCKS_TAGGED": BlocksTagged, "KVFS_META_PARENT": MetaParent,
		"KVFS_TAG_SIZE": TagSize, "KVFS_BLOCKS_INLINE_TAGGED_MAX": BlocksInlineTaggedMax,
		"KVFS_LOOKUP_MAX": LookupMax, "KVFS_LOOKUP_INLINE_MAX": LookupInlineMax,
		"KVFS_LOOKUP_PRESENT": uint32(LookupPresent), "KVFS_LOOKUP_ABSENT": uint32(LookupAbsent),
		"KVFS_LOOKUP_TAG_MISMATCH": uint32(LookupTagMismatch),
		"KVFS_IOC_LOOKUP":          CmdLookup, "KVFS_IOC_LOOKUP_INLINE": CmdLookupInline,
		"sizeof(struct kvfs_lookup_inline)": LookupInlineSize, "sizeof(struct kvfs_blocks_inline_tagged)": BlocksInlineSize,
	}
	for name := range cmds {
		fmt.Fprintf(&src, "\tprintf(\"%s %%llu\\n\", (unsigned long long)(%s));\n", name, name)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "t.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "t")
	if out, err := exec.Command(cc, "-std=c11", "-Wall", "-Werror", "-o", bin, filepath.Join(dir, "t.c")).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		parts := strings.Fields(sc.Text())
		key := strings.Join(parts[:len(parts)-1], " ")
		if strings.HasPrefix(key, "kvfs_") {
			key = parts[0]
			a, _ := strconv.ParseUint(parts[1], 10, 64)
			b, _ := strconv.ParseUint(parts[2], 10, 64)
			got[key] = []uint64{a, b}
			continue
		}
		v, _ := strconv.ParseUint(parts[len(parts)-1], 10, 64)
		got[key] = []uint64{v}
	}
	for _, f := range fields {
		if f.cField == "" {
			if g := got[f.cStruct]; g == nil || g[0] != uint64(f.size) {
				t.Errorf("sizeof(struct %s): C %v, Go %d", f.cStruct, g, f.size)
			}
			continue
		}
		key := f.cStruct + "." + f.cField
		if g := got[key]; g == nil || g[0] != uint64(f.size) || g[1] != uint64(f.off) {
			t.Errorf("%s: C size/offset %v, Go %d/%d", key, g, f.size, f.off)
		}
	}
	for name, want := range cmds {
		if g := got[name]; g == nil || g[0] != uint64(want) {
			t.Errorf("%s: C %v, Go %#x", name, g, want)
		}
	}
}

func TestIoctlNumbers(t *testing.T) {
	// The values documented in docs/abi.md and include/kvfs.h.
	for _, c := range []struct {
		cmd  uint32
		want uint32
	}{
		{CmdInfo, 0x80c0b701}, {CmdRegisterHost, 0xd000b702}, {CmdUnregister, 0x4008b703}, {CmdRegisterFD, 0xc040b705},
		{CmdLoad, 0xfff0b710}, {CmdStore, 0xfff0b711}, {CmdLoadSmall, 0xc7f0b712}, {CmdStoreSmall, 0xc7f0b713},
		{CmdRegisterTarget, 0xffc0b720}, {CmdUnregisterTarget, 0x4008b721}, {CmdLoadBlocks, 0xc040b722},
		{CmdStoreBlocks, 0xc040b723}, {CmdLoadBlocksInline, 0xffe0b724}, {CmdStoreBlocksInline, 0xffe0b725},
		{CmdLookup, 0xc040b726}, {CmdLookupInline, 0xffe0b727},
	} {
		if c.cmd != c.want {
			t.Errorf("command %#x, want %#x", c.cmd, c.want)
		}
	}
	// Commands the VFS handles itself (do_vfs_ioctl, ioctl_fiemap, …) or
	// that FUSE treats specially must not collide with ours.
	vfs := []uint32{
		0x5451, 0x5450, 0x5421, 0x5452, 0x5460, 0x541B, // FIOCLEX FIONCLEX FIONBIO FIOASYNC FIOQSIZE FIONREAD
		0xc0045877, 0xc0045878, // FIFREEZE FITHAW
		0xc020660b, 0x00000002, // FS_IOC_FIEMAP FIGETBSZ
		0x40049409, 0x4020940d, 0xc0189436, // FICLONE FICLONERANGE FIDEDUPERANGE
		0x80086601, 0x40086602, 0x801c581f, 0x401c5820, // FS_IOC_{GET,SET}FLAGS FS_IOC_FS{GET,SET}XATTR
		0x80111500, 0x80811501, // FS_IOC_GETFSUUID FS_IOC_GETFSSYSFSPATH
	}
	for _, ours := range []uint32{CmdInfo, CmdRegisterHost, CmdUnregister, CmdRegisterFD, CmdLoad, CmdStore, CmdLoadSmall, CmdStoreSmall,
		CmdRegisterTarget, CmdUnregisterTarget, CmdLoadBlocks, CmdStoreBlocks, CmdLoadBlocksInline, CmdStoreBlocksInline,
		CmdLookup, CmdLookupInline} {
		for _, v := range vfs {
			if ours == v || (ours>>8&0xff) == (v>>8&0xff) {
				t.Errorf("command %#x shares a type byte with VFS ioctl %#x", ours, v)
			}
		}
		if IoctlSize(ours) > MaxIoctlSize {
			t.Errorf("command %#x too large", ours)
		}
	}
}
