"""integration/gpu/ttft.py on the CPU through a real mount: the TTFT script's smoke test.

The script the GPU measurement runs (docs/performance.md, "TTFT with a real
model"), with --device cpu --tiny: a small random Llama shaped like the
KVFS_MOUNT store, a 256-token prompt, recompute, a full hit and a 50 % hit
loaded layer by layer through kvfs.hf, and the steps of a full hit loaded
in one call (--phases). Asserted: it completes, every hit
loaded the blocks it should (the script checks that and fails otherwise)
and generated the same tokens as recompute. Its timings are not asserted.
Skips without KVFS_MOUNT, torch or transformers (an error in CI, see
conftest.py).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None

MOUNT = os.environ.get("KVFS_MOUNT")
TTFT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "integration", "gpu", "ttft.py")


@unittest.skipUnless(torch is not None and MOUNT, "needs torch, transformers and KVFS_MOUNT")
class TTFTSmokeTest(unittest.TestCase):
    def test_tiny_on_cpu(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "ttft.json")
            p = subprocess.run([sys.executable, TTFT, "--device", "cpu", "--tiny", "--mount", MOUNT,
                                "--tokens", "256", "--repeat", "2", "--new-tokens", "6", "--phases", "--json", out],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, "ttft.py failed:\n%s\n%s" % (p.stdout, p.stderr))
            with open(out) as f:
                res = json.load(f)
        self.assertTrue(res["tokens_match"], res["notes"])
        self.assertEqual(res["model"], "tiny")
        (row,) = res["rows"]
        self.assertEqual(row["tokens"], 256)
        self.assertEqual(len(row["recompute_tokens"]), 6)
        for col in ("recompute_ms", "mount:full_ms", "mount:half:layerwise_ms"):
            self.assertIsNotNone(row.get(col), col)
            self.assertGreater(row[col], 0, col)
        self.assertIn("| 256 |", p.stdout)
        # the layer-by-layer hits report their loader's time and the forward's wait for it
        self.assertEqual(sorted(row["layerwise"]), ["mount:full", "mount:half:layerwise"])
        for col, v in row["layerwise"].items():
            self.assertGreater(v["load_ms"], 0, col)
            self.assertGreaterEqual(v["wait_ms"], 0, col)
        self.assertIn("| 256 | mount:full |", p.stdout)
        self.assertEqual(sorted(row["phases"]), sorted(["ids+names", "lookup", "load_blocks", "cache",
                                                           "first_token"]))
        self.assertTrue(all(v >= 0 for v in row["phases"].values()), row["phases"])


if __name__ == "__main__":
    unittest.main()
