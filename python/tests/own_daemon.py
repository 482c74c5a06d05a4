"""A kvfs daemon of a test's own, for tests that stop, kill or restart it."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

BIN = os.environ.get("KVFS_BIN")


class Daemon:
    """A kvfs daemon of its own: a store file in a temporary directory, mounted by the kvfs binary bin
    (KVFS_BIN)."""

    def __init__(self, size, geometry, bin=BIN):
        self.bin = bin
        self.dir = tempfile.mkdtemp(prefix="kvfs-test-")
        self.store = os.path.join(self.dir, "store")
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        layers, heads, hd, bt, dtype = geometry
        subprocess.run([self.bin, "format", self.store, "--size", size, "--layers", str(layers), "--kv-heads",
                        str(heads), "--head-dim", str(hd), "--block-tokens", str(bt), "--dtype", dtype],
                       check=True, capture_output=True)
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen([self.bin, "mount", self.store, self.mnt], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        ctl = os.path.join(self.mnt, ".kvfs", "ctl")
        for _ in range(200):
            if os.path.exists(ctl):
                return
            if self.proc.poll() is not None:
                raise RuntimeError("kvfs mount exited: %s" % self.proc.stderr.read().decode())
            time.sleep(0.05)
        raise RuntimeError("kvfs mount: no control file after 10 s")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.stderr.close()
        subprocess.run([self.bin, "umount", "--lazy", self.mnt], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
