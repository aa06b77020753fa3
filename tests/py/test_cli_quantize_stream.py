#!/usr/bin/env python3
"""End-to-end tests of the streaming `lockstep quantize` on the CPU: a multi-tensor file (F32, BF16,
F16, pass-through tensors, tails shorter than a vector chunk) gives the same bytes for 1, 2 and 3
threads and matches contract_ref.py; a non-finite value in the last tensor leaves no output; and
`lockstep bench quantize --device cpu` reports the whole command against memcpy.

Usage: python3 tests/py/test_cli_quantize_stream.py PATH_TO_lockstep [unittest args]
Seeds are fresh per run (printed in failure messages); set LOCKSTEP_TEST_SEED to replay one.
"""
import json
import os
import subprocess
import sys
import unittest

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contract_ref as ref  # noqa: E402
from st_files import read_st  # noqa: E402
from test_cli_quantize import CliCase  # noqa: E402 (a temporary folder per test)

BIN = None
SEED = int(os.environ.get("LOCKSTEP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def run(*args, threads=None, check=True):
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"lockstep {' '.join(map(str, args))} -> rc {p.returncode}\n{p.stderr}")
    return p


class StreamTest(CliCase):
    def tensors(self, rng):
        def heavy(shape):
            return (rng.standard_normal(shape) * np.exp(rng.standard_normal(shape) * 2)).astype(np.float32)
        return {
            "a.weight": heavy((64, 800)).astype(ml_dtypes.bfloat16),
            "b.weight": heavy((48, 544)),
            "c.weight": heavy((32, 2080)).astype(np.float16),
            "norm": np.ones(7, np.float32),
            "d.weight": heavy((16, 32)).astype(ml_dtypes.bfloat16),
        }

    def test_thread_count_never_changes_bytes(self):
        rng = np.random.default_rng(SEED)
        t = self.tensors(rng)
        inp = self.path("in.safetensors")
        save_file(t, inp)
        for args in (["--format", "nvfp4", "--scaling", "per_row"], ["--format", "nvfp4", "--block2d"],
                     ["--format", "mxfp8"], ["--format", "fp8", "--scaling", "block_1x128"],
                     ["--format", "fp8", "--scaling", "per_tensor", "--elem", "e5m2"]):
            outs = []
            for threads in (1, 2, 3):
                outp = self.path(f"out{threads}.safetensors")
                run("quantize", inp, "-o", outp, *args, threads=threads)
                got, meta = read_st(outp)
                outs.append({k: v for k, v in got.items()})
                meta.pop("lockstep.run_meta")
            with self.subTest(args=args):
                self.assertEqual(outs[0], outs[1], f"seed {SEED}")
                self.assertEqual(outs[0], outs[2], f"seed {SEED}")
                self.assertEqual(outs[0]["norm"][2], t["norm"].tobytes())
        # One configuration against the independent NumPy contract, tensor by tensor.
        run("quantize", inp, "-o", self.path("nv.safetensors"), "--format", "nvfp4", "--scaling", "per_row")
        got, _ = read_st(self.path("nv.safetensors"))
        for name in ("a.weight", "b.weight", "c.weight", "d.weight"):
            x = t[name].astype(np.float32) if t[name].dtype == np.float16 else t[name]  # exact
            r = ref.nvfp4_quantize(ref.widen(x), "per_row")
            self.assertEqual(got[f"{name}.qdata"][2], r["qdata"].tobytes(), f"seed {SEED} {name}")
            self.assertEqual(got[f"{name}.block_scale"][2], r["block_scale"].tobytes(), f"seed {SEED} {name}")
            self.assertEqual(got[f"{name}.amax"][2], r["amax"].astype(np.float32).tobytes(), f"seed {SEED} {name}")

    def test_nonfinite_in_last_tensor_leaves_nothing(self):
        rng = np.random.default_rng(SEED + 1)
        t = self.tensors(rng)
        t["z.last"] = np.ones((16, 64), np.float32)
        t["z.last"][15, 63] = np.nan
        inp, outp = self.path("in.safetensors"), self.path("out.safetensors")
        save_file(t, inp)
        p = run("quantize", inp, "-o", outp, "--format", "nvfp4", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("z.last", p.stderr)
        self.assertEqual(sorted(os.listdir(self.tmp)), ["in.safetensors"])

    def test_bench_end_to_end(self):
        p = run("bench", "quantize", "--device", "cpu", "--json", "--file-mb", "3", "--runs", "1",
                "--threads", "2", "--rows", "32", "--cols", "256", "--only", "nvfp4 per_row", "--dir", self.tmp)
        js = json.loads(p.stdout)
        rows = js["end_to_end"]
        self.assertEqual([r["op"] for r in rows], ["quantize file nvfp4 per_row"])
        r = rows[0]
        self.assertEqual(r["input_bytes"] > 3 * 2**20 - 2**17 and r["input_bytes"] < 3 * 2**20 + 2**12, True, r)
        # NVFP4 per_row of 4096 columns: 4.5 bits per element plus the header.
        self.assertAlmostEqual(r["output_bytes"] / r["input_bytes"], 4.5 / 16, delta=0.01)
        for k in ("gbps_input", "memcpy_gbps", "peak_rss_bytes"):
            self.assertGreater(r[k], 0, k)
        self.assertAlmostEqual(r["ratio_to_memcpy"], r["gbps_input"] / r["memcpy_gbps"], places=9)
        self.assertEqual((r["target"], r["rss_target"], r["threads"]), (0.5, 2.0, 2))
        self.assertEqual(sorted(os.listdir(self.tmp)), [], "the bench removes its files")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_cli_quantize_stream.py PATH_TO_lockstep [unittest args]")
    BIN = os.path.abspath(sys.argv.pop(1))
    print(f"lockstep binary {BIN}; seed {SEED} (LOCKSTEP_TEST_SEED to replay)", flush=True)
    unittest.main(verbosity=2)
