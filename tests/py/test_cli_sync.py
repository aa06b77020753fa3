#!/usr/bin/env python3
"""`lockstep serve-weights`, `receive-weights` and `bench sync` refusals that need no GPU: a CPU
device for CUDA IPC, a missing socket flag, a socket path already in use, a machine without a GPU
(each a clear error and a non-zero exit, no socket file left behind), and `bench sync` on the CPU
with a tiny preset (runs, prints the ratio to bf16). On a machine with a GPU the GPU-only refusals
are skipped (scripts/gpu-check runs the real transfer).

Run: python3 tests/py/test_cli_sync.py PATH_TO_lockstep_BINARY
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import run_lockstep  # noqa: E402

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_cli_sync.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))


def run(*args, **kw):
    return run_lockstep(LOCKSTEP, *args, **kw)


class Sync(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lockstep-sync-")
        doctor = json.loads(run("doctor", "--json").stdout)
        cls.gpus = len(doctor["gpus"])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def failed(self, r, *needles):
        self.assertNotEqual(r.returncode, 0, f"stdout={r.stdout!r} stderr={r.stderr!r}")
        self.assertIn("lockstep: ", r.stderr)
        for n in needles:
            self.assertIn(n, r.stderr)

    def test_cpu_device_is_refused(self):
        sock = os.path.join(self.tmp, "cpu.sock")
        r = run("serve-weights", "--preset", "tiny-moe", "--recipe", "bf16", "--socket", sock,
                "--device", "cpu", check=False)
        self.failed(r, "CUDA IPC needs a CUDA device")
        self.assertEqual(r.returncode, 2)
        self.assertFalse(os.path.exists(sock))
        r = run("receive-weights", "--socket", sock, "--device", "cpu", check=False)
        self.failed(r, "CUDA IPC needs a CUDA device")

    def test_socket_is_required(self):
        r = run("serve-weights", "--preset", "tiny-moe", "--recipe", "bf16", check=False)
        self.failed(r, "--socket")
        r = run("receive-weights", check=False)
        self.failed(r, "--socket")

    def test_without_a_gpu_both_ends_refuse(self):
        if self.gpus > 0:
            self.skipTest("a GPU is visible")
        sock = os.path.join(self.tmp, "nogpu.sock")
        for args in (["serve-weights", "--preset", "tiny-moe", "--recipe", "bf16", "--socket", sock],
                     ["receive-weights", "--socket", sock]):
            r = run(*args, check=False)
            self.failed(r)
            self.assertRegex(r.stderr, "(?i)cuda|gpu")
        self.assertFalse(os.path.exists(sock))

    def test_socket_in_use_is_refused(self):
        if self.gpus == 0:
            self.skipTest("the path check runs after the GPU check")
        sock = os.path.join(self.tmp, "used.sock")
        open(sock, "w").close()
        r = run("serve-weights", "--preset", "tiny-moe", "--recipe", "bf16", "--socket", sock,
                check=False)
        self.failed(r, "exists")

    def test_bench_sync_on_the_cpu(self):
        r = run("bench", "sync", "--device", "cpu", "--preset", "tiny-moe", "--recipe", "bf16",
                "mxfp8", "--reps", "1", "--warmup", "0", "--json")
        j = json.loads(r.stdout)
        rows = {x["recipe"]: x for x in j["results"]}
        self.assertEqual(set(rows), {"bf16", "mxfp8"})
        self.assertEqual(rows["bf16"]["ratio_to_bf16"], 1.0)
        self.assertGreater(rows["mxfp8"]["convert_sync_ms"], 0)
        self.assertEqual(rows["mxfp8"]["target_ratio"], 0.75)
        self.assertEqual(rows["mxfp8"]["device_to_host_copies_per_version"], 0)
        self.assertFalse(rows["mxfp8"]["optimizer_amax"])
        # nvfp4_per_tensor's weights take an outer amax: the bench takes it from an AdamW step
        # and checks that export against the one that reads the masters (equal checksums).
        r = run("bench", "sync", "--device", "cpu", "--preset", "tiny-moe", "--recipe",
                "nvfp4_per_tensor", "--reps", "1", "--warmup", "0", "--json")
        row = json.loads(r.stdout)["results"][0]
        self.assertTrue(row["optimizer_amax"])
        self.assertGreater(row["export_read_amax_ms"], 0)
        r = run("bench", "sync", "--device", "cpu", "--preset", "tiny-moe", "--recipe", "nope",
                check=False)
        self.failed(r, "nope")


if __name__ == "__main__":
    unittest.main()
