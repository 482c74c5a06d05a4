# Does a legacy CUDA IPC handle name its exporter? Export two allocations
# from this process and one from a child, and look for the exporting pid in
# the 64 bytes (information for docs/abi.md, "What is trusted").
import ctypes, os, subprocess, sys
import torch

def handle():
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    lib = ctypes.CDLL("libcuda.so.1")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    assert lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(x.data_ptr())) == 0
    h = (ctypes.c_ubyte * 64)()
    r = lib.cuIpcGetMemHandle(ctypes.byref(h), base)
    return r, bytes(h), x

if len(sys.argv) > 1:
    r, b, _ = handle()
    print(os.getpid(), b.hex())
    sys.exit(0)
pid = os.getpid()
r1, b1, x1 = handle()
r2, b2, x2 = handle()
out = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True).stdout.split()
cpid, cb = int(out[0]), bytes.fromhex(out[1])
for name, p, b in (("parent#1", pid, b1), ("parent#2", pid, b2), ("child", cpid, cb)):
    le4 = p.to_bytes(4, "little")
    print(f"ipc-probe {name} pid {p}: handle {b.hex()} pid-bytes-at {b.find(le4)}")
print("ipc-probe bytes differing parent#1/#2:", [i for i in range(64) if b1[i] != b2[i]])
print("ipc-probe bytes differing parent/child:", [i for i in range(64) if b1[i] != cb[i]])
