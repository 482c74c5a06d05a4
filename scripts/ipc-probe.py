# Does a legacy CUDA IPC handle name its exporter, and does the driver rely
# on it? Export two allocations from this process and one from a child and
# look for the exporting pid in the 64 bytes; then let a third process open
# a live exporter's handle as is, and with the pid bytes rewritten to this
# process's pid (what a client would do to pass the daemon's exporter
# check with another process's handle). Information for docs/abi.md, "What
# is trusted".
import ctypes, os, subprocess, sys
import torch

lib = ctypes.CDLL("libcuda.so.1")

def handle():
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    assert lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(x.data_ptr())) == 0
    h = (ctypes.c_ubyte * 64)()
    r = lib.cuIpcGetMemHandle(ctypes.byref(h), base)
    return r, bytes(h), x

if len(sys.argv) > 1 and sys.argv[1] == "child":
    r, b, _ = handle()
    print(os.getpid(), b.hex(), flush=True)
    if len(sys.argv) > 2:  # stay alive until told
        sys.stdin.readline()
    sys.exit(0)
if len(sys.argv) > 1 and sys.argv[1] == "open":
    torch.zeros(1, device="cuda")  # a context
    class Handle(ctypes.Structure):  # CUipcMemHandle, passed by value
        _fields_ = [("reserved", ctypes.c_ubyte * 64)]
    h = Handle.from_buffer_copy(bytes.fromhex(sys.argv[2]))
    p = ctypes.c_uint64()
    lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), Handle, ctypes.c_uint]
    r = lib.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, 1)
    print(r)
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

# A live exporter; a third process opens its handle as is and forged.
exp = subprocess.Popen([sys.executable, __file__, "child", "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
epid, eh = exp.stdout.readline().split()
eh = bytes.fromhex(eh)
forged = eh[:8] + pid.to_bytes(4, "little") + eh[12:]
def opened(h):
    return subprocess.run([sys.executable, __file__, "open", h.hex()], capture_output=True, text=True).stdout.strip()
print(f"ipc-probe open exporter {epid}'s handle as is: CUresult {opened(eh)}")
print(f"ipc-probe open it with pid bytes rewritten to {pid}: CUresult {opened(forged)} (nonzero: the driver refuses)")
exp.stdin.write("\n"); exp.stdin.flush(); exp.wait()
