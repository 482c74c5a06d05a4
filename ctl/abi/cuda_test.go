package abi

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

func TestRegisterCUDALayout(t *testing.T) {
	if unsafe.Sizeof(RegisterCUDA{}) != RegisterCUDASize {
		t.Fatalf("sizeof RegisterCUDA = %d", unsafe.Sizeof(RegisterCUDA{}))
	}
	if CmdRegisterCUDA != 0xc080b704 {
		t.Fatalf("KVFS_IOC_REGISTER_CUDA = %#x", CmdRegisterCUDA)
	}
	r := RegisterCUDA{}
	img := unsafe.Slice((*byte)(unsafe.Pointer(&r)), RegisterCUDASize)
	for i := range img {
		img[i] = byte(i*7 + 3)
	}
	b := make([]byte, RegisterCUDASize)
	r.Marshal(b)
	if !bytes.Equal(b, img) {
		t.Fatal("Marshal differs from the memory image")
	}
	var u RegisterCUDA
	u.Unmarshal(b)
	if !reflect.DeepEqual(u, r) {
		t.Fatal("Unmarshal(Marshal(x)) != x")
	}
}

// TestRegisterCUDACHeader compiles include/kvfs.h and compares the C
// struct's offsets and the ioctl number with Go's.
func TestRegisterCUDACHeader(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	hdr, _ := filepath.Abs("../../include/kvfs.h")
	ty := reflect.TypeOf(RegisterCUDA{})
	var src, want strings.Builder
	fmt.Fprintf(&src, "#include <stdio.h>\n#include <stddef.h>\n#include %q\nint main(void) {\n", hdr)
	fmt.Fprintf(&src, "\tprintf(\"%%zu %%#lx\\n\", sizeof(struct kvfs_register_cuda), (unsigned long)KVFS_IOC_REGISTER_CUDA);\n")
	fmt.Fprintf(&want, "%d %#x\n", ty.Size(), CmdRegisterCUDA)
	for i := range ty.NumField() {
		f := ty.Field(i)
		c := cName(f.Name)
		fmt.Fprintf(&src, "\tprintf(\"%s %%zu %%zu\\n\", offsetof(struct kvfs_register_cuda, %s), sizeof(((struct kvfs_register_cuda *)0)->%s));\n", c, c, c)
		fmt.Fprintf(&want, "%s %d %d\n", c, f.Offset, f.Type.Size())
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-std=c11", "-Wall", "-Werror", "-o", filepath.Join(dir, "c"), filepath.Join(dir, "c.c")).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(dir, "c")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != want.String() {
		t.Fatalf("C layout:\n%s\nGo layout:\n%s", out, want.String())
	}
}

func registerCUDAReq(mut func(*RegisterCUDA)) []byte {
	r := RegisterCUDA{ABI: Version, Offset: 4096, Length: 1 << 20, Device: 0}
	for i := range r.Handle {
		r.Handle[i] = byte(i)
	}
	if mut != nil {
		mut(&r)
	}
	b := make([]byte, RegisterCUDASize)
	r.Marshal(b)
	return b
}

func TestDecodeRegisterCUDA(t *testing.T) {
	req, err := Decode(CmdRegisterCUDA, registerCUDAReq(nil), RegisterCUDASize)
	if err != nil {
		t.Fatal(err)
	}
	if req.Op != OpRegisterCUDA || req.RegisterCUDA.Length != 1<<20 || req.RegisterCUDA.Handle[63] != 63 || req.Op.String() != "register-cuda" {
		t.Fatalf("decoded %+v", req.RegisterCUDA)
	}
	for _, c := range []struct {
		name string
		mut  func(*RegisterCUDA)
		want error
	}{
		{"version", func(r *RegisterCUDA) { r.ABI = 9 }, ErrVersion},
		{"flags", func(r *RegisterCUDA) { r.Flags = 1 }, ErrFlags},
		{"buffer", func(r *RegisterCUDA) { r.Buffer = 3 }, ErrReserved},
		{"reserved", func(r *RegisterCUDA) { r.Reserved[3] = 1 }, ErrReserved},
		{"zero length", func(r *RegisterCUDA) { r.Length = 0 }, ErrRange},
		{"overflow", func(r *RegisterCUDA) { r.Offset = ^uint64(0) - 10 }, ErrRange},
	} {
		if _, err := Decode(CmdRegisterCUDA, registerCUDAReq(c.mut), RegisterCUDASize); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := Decode(CmdRegisterCUDA, make([]byte, 64), RegisterCUDASize); !errors.Is(err, ErrSize) {
		t.Errorf("short: %v", err)
	}
}

func FuzzDecodeRegisterCUDA(f *testing.F) {
	f.Add(registerCUDAReq(nil))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) != RegisterCUDASize {
			in = append(in, make([]byte, RegisterCUDASize)...)[:RegisterCUDASize]
		}
		req, err := Decode(CmdRegisterCUDA, in, RegisterCUDASize)
		if err != nil {
			return
		}
		r := req.RegisterCUDA
		if r.Length == 0 || r.Offset+r.Length < r.Offset || r.Flags != 0 || r.Buffer != 0 {
			t.Fatalf("accepted %+v", r)
		}
		out := make([]byte, RegisterCUDASize)
		r.Marshal(out)
		if !bytes.Equal(out, in) {
			t.Fatal("re-encoding differs")
		}
	})
}
