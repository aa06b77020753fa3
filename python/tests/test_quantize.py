"""lockstep.quantize / dequantize / QTensor / files against the CLI, byte for byte: every format and
scaling (and the options: block2d, colwise, pow2, e5m2, stochastic rounding, Hadamard, swizzled
scales) on float32, bfloat16 and float16 NumPy arrays of awkward shapes; zero-copy in and out;
bad input raising lockstep.Error naming the tensor and the rule.

Usage: PYTHONPATH=BUILD/python python3 test_quantize.py PATH_TO_lockstep
(a fresh seed each run, printed; LOCKSTEP_TEST_SEED replays one)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file as st_save

import lockstep
from lockstep import _lockstep

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "py"))
from st_files import read_st  # noqa: E402

CLI = None
SEED = int(os.environ.get("LOCKSTEP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# (format, scaling, options): every scaling of every format, and each option once or more.
CASES = [
    ("nvfp4", "per_tensor", {}),
    ("nvfp4", "per_row", {}),
    ("nvfp4", "per_tensor", {"block2d": True}),
    ("nvfp4", "per_tensor", {"colwise": True}),
    ("nvfp4", "per_row", {"colwise": True}),
    ("nvfp4", "per_tensor", {"block2d": True, "colwise": True}),
    ("nvfp4", "per_row", {"hadamard": True}),
    ("nvfp4", "per_tensor", {"stochastic": True, "seed": 7, "rng_stream": 3}),
    ("nvfp4", "per_row", {"scale_layout": "swizzled"}),
    ("mxfp8", "block_1x32", {}),
    ("mxfp8", "block_1x32", {"colwise": True}),
    ("mxfp8", "block_1x32", {"elem": "e5m2"}),
    ("mxfp8", "block_1x32", {"stochastic": True, "seed": 11, "rng_stream": 1}),
    ("fp8", "per_tensor", {}),
    ("fp8", "per_row", {}),
    ("fp8", "block_1x128", {}),
    ("fp8", "block_128x128", {}),
    ("fp8", "per_tensor", {"colwise": True}),
    ("fp8", "per_row", {"colwise": True}),
    ("fp8", "block_1x128", {"colwise": True, "pow2": True}),
    ("fp8", "block_128x128", {"colwise": True}),
    ("fp8", "per_tensor", {"elem": "e5m2", "eps": 1e-3}),
]

FLAG = {"block2d": "--block2d", "colwise": "--colwise", "pow2": "--pow2", "hadamard": "--hadamard",
        "stochastic": "--stochastic"}
VALUE = {"elem": "--elem", "seed": "--seed", "rng_stream": "--stream", "eps": "--eps",
         "scale_layout": "--scale-layout"}
SUFFIX = {"data": "qdata", "block_scale": "block_scale", "amax": "amax", "scale_inv": "scale_inv"}


def cli_args(fmt, scaling, opts):
    args = ["--format", fmt, "--scaling", scaling]
    for k, v in opts.items():
        if k in FLAG and v:
            args.append(FLAG[k])
        elif k in VALUE:
            args += [VALUE[k], repr(v) if isinstance(v, float) else str(v)]
    return args


def file_name(part):
    base, col = (part[:-8], "_colwise") if part.endswith("_colwise") else (part, "")
    return SUFFIX[base] + col


def values(rng, shape, dtype):
    x = (rng.standard_t(2.5, size=shape) * np.exp(rng.standard_normal(shape))).astype(np.float32)
    x[0, :3] = 0.0  # a zero block start
    return np.ascontiguousarray(x.astype(dtype))


class Common(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def cli(self, *args, check=True):
        p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)
        if check and p.returncode != 0:
            self.fail(f"lockstep {' '.join(map(str, args))}: rc {p.returncode}\n{p.stderr}")
        return p


class QuantizeMatchesCli(Common):
    """lockstep.quantize == `lockstep quantize` on the same values, every part byte for byte."""

    def check(self, x, fmt, scaling, opts, ctx):
        inp, outp = self.path("in.safetensors"), self.path("out.safetensors")
        st_save({"w": x}, inp)
        self.cli("quantize", inp, "-o", outp, *cli_args(fmt, scaling, opts))
        want, meta = read_st(outp)
        q = lockstep.quantize(x, fmt, scaling, name="w", **opts)
        self.assertEqual(q.shape, x.shape, ctx)
        parts = q.parts()
        names = {f"w.{file_name(p)}" for p in parts}
        self.assertEqual(names, {k for k in want if k.startswith("w.")}, ctx)
        for p, arr in parts.items():
            dt, shape, raw = want[f"w.{file_name(p)}"]
            self.assertIsInstance(arr, np.ndarray, ctx)
            got = np.ascontiguousarray(arr).tobytes()
            self.assertEqual(len(got), len(raw), f"{ctx} {p}: {arr.shape} vs file {shape}")
            if got != raw:
                bad = np.flatnonzero(np.frombuffer(got, np.uint8) != np.frombuffer(raw, np.uint8))
                self.fail(f"{ctx} part {p}: {bad.size} bytes differ, first at byte {bad[0]}")
            if dt in ("F8_E4M3", "F8_E5M2", "F8_E8M0"):
                real = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu"}
                self.assertEqual(q.dtype_of(p), real[dt], ctx + " " + p)
                self.assertEqual(arr.dtype, np.uint8, ctx + " " + p)
        # The file lockstep.save_file writes holds the same tensors and lockstep.w.* metadata.
        mine = self.path("mine.safetensors")
        lockstep.save_file(mine, {"w": q})
        got_file, got_meta = read_st(mine)
        self.assertEqual(got_file, {k: v for k, v in want.items()}, ctx + ": save_file tensors")
        for k, v in meta.items():
            if k.startswith("lockstep.w.") or k == "lockstep.contract":
                self.assertEqual(got_meta.get(k), v, f"{ctx}: metadata {k}")
        # dequantize == `lockstep dequantize` (f32), each copy the CLI rebuilds from.
        dq = self.path("dq.safetensors")
        self.cli("dequantize", outp, "-o", dq, "--dtype", "f32")
        want_dq, _ = read_st(dq)
        self.assertEqual(q.dequantize().tobytes(), want_dq["w"][2], ctx + ": dequantize")

    def test_every_format_and_scaling(self):
        rng = np.random.default_rng(SEED)
        for dtype, label in ((np.float32, "f32"), (ml_dtypes.bfloat16, "bf16"), (np.float16, "f16")):
            for fmt, scaling, opts in CASES:
                rows = 256 if scaling == "block_128x128" or opts.get("block2d") or opts.get("colwise") else 33
                cols = 160 if fmt != "fp8" else 200  # partial last fp8 blocks
                if fmt == "fp8" and (opts.get("colwise") or scaling == "block_128x128"):
                    rows = 130
                if opts.get("hadamard"):
                    cols = 128
                x = values(rng, (rows, cols), dtype)
                ctx = f"[LOCKSTEP_TEST_SEED={SEED}] {label} {fmt} {scaling} {opts} {x.shape}"
                with self.subTest(ctx=ctx):
                    self.check(x, fmt, scaling, opts, ctx)

    def test_grouped_per_group(self):
        rng = np.random.default_rng(SEED + 1)
        x = values(rng, (48, 64), np.float32)
        q = lockstep.quantize(x, "nvfp4", "per_group", offsets=[0, 16, 16, 48])
        self.assertEqual(q.group_offsets, [0, 16, 16, 48])
        self.assertEqual(q.amax.shape, (3,))
        for g, (a, b) in enumerate(((0, 16), (16, 16), (16, 48))):
            alone = lockstep.quantize(x[a:b], "nvfp4", "per_tensor") if b > a else None
            if alone is not None:
                self.assertEqual(q.data[a:b].tobytes(), alone.data.tobytes(), f"group {g}")
                self.assertEqual(q.amax[g], alone.amax[()], f"group {g}")

    def test_bf16_dequantize_and_roundtrip_file(self):
        rng = np.random.default_rng(SEED + 2)
        x = values(rng, (32, 64), np.float32)
        q = lockstep.quantize(x, "mxfp8", colwise=True)
        f32 = q.dequantize()
        bf = q.dequantize("bf16")
        self.assertEqual(bf.dtype, ml_dtypes.bfloat16)
        self.assertEqual(bf.tobytes(), f32.astype(ml_dtypes.bfloat16).tobytes())
        self.assertEqual(q.dequantize(copy="colwise").shape, (32, 64))
        p = self.path("q.safetensors")
        q.save(p, "w")
        back = lockstep.QTensor.load(p, "w")
        for name, arr in q.parts().items():
            self.assertEqual(back.part(name).tobytes(), arr.tobytes(), name)
        self.assertEqual((back.format, back.scaling, back.has_colwise), ("mxfp8", "block_1x32", True))
        lockstep.save_file(p, {"w": q, "b": x[:2].astype(ml_dtypes.bfloat16)})
        tensors, meta = lockstep.load_file(p)
        self.assertIsInstance(tensors["w"], lockstep.QTensor)
        self.assertEqual(tensors["b"].dtype, ml_dtypes.bfloat16)  # a dense bf16 tensor
        self.assertEqual(tensors["b"].tobytes(), x[:2].astype(ml_dtypes.bfloat16).tobytes())
        self.assertEqual(meta["lockstep.contract"], "1")


class ZeroCopy(Common):
    def test_input_is_read_in_place(self):
        x = np.ones((16, 32), np.float32)
        self.assertEqual(_lockstep._data_ptr(x), x.ctypes.data)
        v = x[4:12]  # a row range of a contiguous array is contiguous: shared, not copied
        self.assertEqual(_lockstep._data_ptr(v), v.ctypes.data)

    def test_output_parts_are_lockstep_memory(self):
        x = np.random.default_rng(SEED).standard_normal((32, 64)).astype(np.float32)
        q = lockstep.quantize(x, "nvfp4", "per_row", colwise=True)
        for name in q.handle.parts():
            self.assertEqual(q.part(name).ctypes.data, q.handle._part_ptr(name), name)
        y = np.from_dlpack(_lockstep._roundtrip(x))
        self.assertEqual(y.ctypes.data, x.ctypes.data)

    def test_no_device_to_host_copies_on_cpu(self):
        before = lockstep.device_to_host_copies()
        x = np.ones((16, 32), np.float32)
        lockstep.quantize(x, "nvfp4").dequantize()
        self.assertEqual(lockstep.device_to_host_copies(), before)

    def test_input_outlives_python_reference(self):
        x = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
        y = np.from_dlpack(_lockstep._roundtrip(x))
        del x
        self.assertEqual(float(y[15, 31]), 16 * 32 - 1.0)


class BadInput(Common):
    """Every refusal is a lockstep.Error (a ValueError) naming the tensor and the rule."""

    def raises(self, fn, *words):
        with self.assertRaises(lockstep.Error) as cm:
            fn()
        msg = str(cm.exception)
        for w in words:
            self.assertIn(w, msg)
        self.assertIsInstance(cm.exception, ValueError)
        return msg

    def test_refusals(self):
        x = np.ones((32, 64), np.float32)
        self.raises(lambda: lockstep.quantize(x.astype(np.int32), "nvfp4"), "x", "I32", "float32")
        self.raises(lambda: lockstep.quantize(x.T, "nvfp4"), "x", "contiguous")
        self.raises(lambda: lockstep.quantize(x[:, ::2], "nvfp4"), "x", "contiguous")
        self.raises(lambda: lockstep.quantize(np.ones((8, 40), np.float32), "nvfp4", name="wq"),
                    "wq", "16")
        self.raises(lambda: lockstep.quantize(np.ones((8, 48), np.float32), "mxfp8"), "x", "32")
        self.raises(lambda: lockstep.quantize(np.ones((8, 64), np.float32), "nvfp4", block2d=True),
                    "x", "16")
        self.raises(lambda: lockstep.quantize(np.ones(64, np.float32), "nvfp4"), "x", "2-D")
        self.raises(lambda: lockstep.quantize([[1.0] * 16], "nvfp4"), "x", "list", "__dlpack__")
        self.raises(lambda: lockstep.quantize(x, "nvfp5"), "nvfp5", "nvfp4, mxfp8 or fp8")
        self.raises(lambda: lockstep.quantize(x, "nvfp4", "per_col"), "per_col")
        self.raises(lambda: lockstep.quantize(x, "nvfp4", "per_group"), "x")
        self.raises(lambda: lockstep.quantize(x, "nvfp4", "block_1x32"), "x")
        self.raises(lambda: lockstep.quantize(x, "fp8", elem="e3m4"), "elem")
        self.raises(lambda: lockstep.quantize(x, "nvfp4").dequantize(copy="colwise"), "colwise")
        self.raises(lambda: lockstep.quantize(x, "nvfp4").dequantize("f64"), "dtype")
        self.raises(lambda: lockstep.quantize(x, "nvfp4").to("tpu"), "tpu")
        self.raises(lambda: lockstep.QTensor.load(self.path("missing.safetensors")), "missing")
        self.raises(lambda: lockstep.quantize(x, "nvfp4", stream="s"), "stream")
        if not lockstep.cuda_compiled:
            with self.assertRaises(RuntimeError) as cm:
                lockstep.quantize(x, "nvfp4").to("cuda")
            self.assertIn("CUDA", str(cm.exception))


class Package(Common):
    def test_version_is_the_libraries(self):
        with open(os.path.join(SRC, "CMakeLists.txt")) as f:
            text = f.read()
        want = text.split("project(lockstep VERSION ", 1)[1].split()[0]
        self.assertEqual(lockstep.__version__, want)
        p = self.cli("--version")
        self.assertIn(f"lockstep {want} ", p.stdout)

    def test_python_m_lockstep_runs_the_cli(self):
        env = dict(os.environ)
        env.pop("LOCKSTEP_CLI", None)
        p = subprocess.run([sys.executable, "-m", "lockstep", "recipes", "--json"], env=env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([r["name"] for r in json.loads(p.stdout)],
                         [r["name"] for r in lockstep.recipes()])
        bad = subprocess.run([sys.executable, "-m", "lockstep", "nosuchcommand"], env=env,
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("lockstep: error: unknown command 'nosuchcommand'", bad.stderr)

    def test_stubs_exist(self):
        pkg = os.path.dirname(lockstep.__file__)
        with open(os.path.join(pkg, "_lockstep.pyi")) as f:
            stub = f.read()
        for name in ("def quantize(", "class QTensor", "def qgemm(", "class Learner"):
            self.assertIn(name, stub)
        self.assertTrue(os.path.exists(os.path.join(pkg, "py.typed")))


if __name__ == "__main__":
    CLI = os.path.abspath(sys.argv.pop(1))
    print(f"LOCKSTEP_TEST_SEED={SEED}", flush=True)
    unittest.main(verbosity=1)
