"""Cross-check of lockstep's safetensors reader against files written by Hugging Face's
`safetensors` package: `lockstep inspect --json` must report the names, dtypes, shapes, byte
counts and metadata that HF wrote, and refuse broken files with exit code 2 and a message.

Run: python3 tests/py/test_safetensors_interop.py PATH_TO_lockstep_BINARY
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_safetensors_interop.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))

try:
    import numpy as np
    from safetensors.numpy import save_file

    MISSING = None
except ImportError as e:  # CI installs both; a developer machine may not have them
    MISSING = f"needs the PyPI packages 'safetensors' and 'numpy' ({e})"

# numpy dtype -> safetensors dtype name
DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
}


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def run_inspect(path, *extra):
    return subprocess.run([LOCKSTEP, "inspect", path, *extra], capture_output=True, text=True, timeout=60)


@unittest.skipIf(MISSING is not None, MISSING or "")
class HuggingFaceFiles(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="lockstep_interop_")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def save(self, tensors, metadata=None, name="hf.safetensors"):
        path = os.path.join(self.dir, name)
        save_file(tensors, path, metadata=metadata)
        return path

    def inspect_json(self, path):
        r = run_inspect(path, "--json")
        self.assertEqual(r.returncode, 0, f"lockstep inspect failed on {path}: {r.stderr}")
        return json.loads(r.stdout)

    def test_every_numpy_dtype_names_dtypes_shapes(self):
        rng = np.random.default_rng(1234)
        tensors = {}
        shapes = [(3, 5), (7,), (), (0, 4), (2, 1, 3)]
        for i, np_name in enumerate(DTYPES):
            shape = shapes[i % len(shapes)]
            values = rng.integers(0, 2 if np_name == "bool" else 100, size=shape)
            tensors[f"t.{np_name}"] = np.asarray(values).astype(np_name)
        meta = {"format": "np", "note": "written by huggingface safetensors"}
        report = self.inspect_json(self.save(tensors, meta))

        self.assertEqual(report["metadata"], meta)
        got = {t["name"]: t for t in report["tensors"]}
        self.assertEqual(set(got), set(tensors))
        for name, arr in tensors.items():
            with self.subTest(tensor=name):
                self.assertEqual(got[name]["dtype"], DTYPES[str(arr.dtype)])
                self.assertEqual(tuple(got[name]["shape"]), arr.shape)
                self.assertEqual(got[name]["bytes"], arr.nbytes)
        self.assertEqual(report["quantized"], [])

    def test_file_order_is_data_order(self):
        # HF lays data out by (alignment, name); lockstep lists tensors in data order, so the
        # byte counts must add up to consecutive offsets with no gaps.
        tensors = {"b": np.zeros((4, 4), np.float16), "a": np.ones(3, np.float64), "c": np.arange(5, dtype=np.uint8)}
        path = self.save(tensors)
        report = self.inspect_json(path)
        header_len = struct.unpack("<Q", read_bytes(path)[:8])[0]
        self.assertEqual(8 + header_len + sum(t["bytes"] for t in report["tensors"]), os.path.getsize(path))
        self.assertEqual(sorted(t["name"] for t in report["tensors"]), ["a", "b", "c"])

    def test_quantized_groups(self):
        rows, cols = 4, 32
        tensors = {
            "layer.w.qdata": np.zeros((rows, cols // 2), np.uint8),
            "layer.w.amax": np.array(1.0, np.float32),
            "plain": np.zeros(3, np.float32),
        }
        meta = {
            "lockstep.contract": "1",
            "lockstep.layer.w.format": "nvfp4",
            "lockstep.layer.w.scaling": "per_tensor",
            "lockstep.layer.w.block2d": "false",
            "lockstep.layer.w.elem": "e2m1",
            "lockstep.layer.w.shape": f"{rows},{cols}",
            "lockstep.layer.w.dtype": "BF16",
        }
        report = self.inspect_json(self.save(tensors, meta))
        self.assertEqual(len(report["quantized"]), 1, report["quantized"])
        q = report["quantized"][0]
        self.assertEqual(q["name"], "layer.w")
        self.assertEqual(q["format"], "nvfp4")
        self.assertEqual(q["scaling"], "per_tensor")
        self.assertIs(q["block2d"], False)
        self.assertEqual(q["elem"], "e2m1")
        self.assertEqual(q["shape"], [rows, cols])
        self.assertEqual(q["dtype"], "BF16")
        self.assertEqual(q["parts"], ["layer.w.qdata", "layer.w.amax"])

    def test_offset_rules_agree_with_huggingface(self):
        # Hand-made layouts: the Hugging Face reader is the outside reference for which ones a
        # safetensors reader accepts (tensors, sorted by offsets, tile the data buffer exactly).
        from safetensors.numpy import load

        def raw(header, data):
            h = json.dumps(header).encode()
            return struct.pack("<Q", len(h)) + h + data

        def u8(n, begin):
            return {"dtype": "U8", "shape": [n], "data_offsets": [begin, begin + n]}

        cases = {
            "contiguous": (raw({"a": u8(2, 0), "b": u8(2, 2)}, b"abcd"), True),
            "out_of_header_order": (raw({"b": u8(2, 2), "a": u8(2, 0)}, b"abcd"), True),
            "empty_at_start": (raw({"e": u8(0, 0), "a": u8(4, 0)}, b"abcd"), True),
            "empty_at_end": (raw({"a": u8(4, 0), "e": u8(0, 4)}, b"abcd"), True),
            "no_tensors": (raw({}, b""), True),
            "gap_between": (raw({"a": u8(2, 0), "b": u8(1, 3)}, b"abcd"), False),
            "gap_before_first": (raw({"a": u8(2, 1)}, b"abc"), False),
            "trailing_bytes": (raw({"a": u8(2, 0)}, b"abc"), False),
            "only_trailing": (raw({}, b"zz"), False),
            "empty_inside_other": (raw({"a": u8(4, 0), "e": u8(0, 2)}, b"abcd"), False),
            "empty_beyond_end": (raw({"a": u8(4, 0), "e": u8(0, 9)}, b"abcd"), False),
            "overlap": (raw({"a": u8(2, 0), "b": u8(2, 1)}, b"abc"), False),
            "aliased": (raw({"a": u8(2, 0), "b": u8(2, 0)}, b"ab"), False),
        }
        for name, (data, valid) in cases.items():
            with self.subTest(case=name):
                try:
                    load(data)
                    hf_ok = True
                except Exception:  # safetensors_rust.SafetensorError
                    hf_ok = False
                self.assertEqual(hf_ok, valid, f"the reference reader disagrees with the expectation for {name}")
                path = os.path.join(self.dir, name + ".safetensors")
                with open(path, "wb") as f:
                    f.write(data)
                r = run_inspect(path, "--json")
                self.assertEqual(r.returncode, 0 if valid else 2, f"{name}: {r.stderr}")
                if not valid:
                    self.assertIn(path, r.stderr)

    def test_empty_tensor_name_is_stricter_than_huggingface(self):
        # The package itself accepts a tensor named "" (0.8.0); lockstep refuses it at read time,
        # naming the file, because such a name cannot be a model weight and makes the per-tensor
        # metadata keys (lockstep.NAME.format) ambiguous.
        path = self.save({"": np.zeros(2, np.float32), "w": np.ones(2, np.float32)})
        r = run_inspect(path)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn(path, r.stderr)
        self.assertIn("empty name", r.stderr)

    def test_human_output_lists_tensors(self):
        path = self.save({"embed.weight": np.zeros((2, 3), np.float32)}, {"k": "v"})
        r = run_inspect(path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("embed.weight", r.stdout)
        self.assertIn("[2, 3]", r.stdout)
        self.assertIn("F32", r.stdout)

    def test_truncated_file_exit_2(self):
        path = self.save({"w": np.arange(64, dtype=np.float32)})
        data = read_bytes(path)
        for cut in (len(data) - 1, 20, 5):
            with self.subTest(cut=cut):
                bad = os.path.join(self.dir, f"cut{cut}.safetensors")
                with open(bad, "wb") as f:
                    f.write(data[:cut])
                r = run_inspect(bad, "--json")
                self.assertEqual(r.returncode, 2, f"stdout={r.stdout!r} stderr={r.stderr!r}")
                self.assertIn(bad, r.stderr)
                self.assertEqual(r.stdout, "")

    def test_truncated_data_names_tensor(self):
        path = self.save({"w": np.arange(64, dtype=np.float32)})
        data = read_bytes(path)
        bad = os.path.join(self.dir, "short.safetensors")
        with open(bad, "wb") as f:
            f.write(data[:-4])
        r = run_inspect(bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn("tensor 'w'", r.stderr)
        self.assertIn("beyond the data buffer", r.stderr)


class BrokenFiles(unittest.TestCase):
    """Needs only the lockstep binary."""

    def write(self, data):
        f = tempfile.NamedTemporaryFile(prefix="lockstep_bad_", suffix=".safetensors", delete=False)
        self.addCleanup(os.unlink, f.name)
        f.write(data)
        f.close()
        return f.name

    def test_garbage_header_exit_2(self):
        text = b"{not json at all"
        path = self.write(struct.pack("<Q", len(text)) + text)
        r = run_inspect(path)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("not valid JSON", r.stderr)
        self.assertIn(path, r.stderr)

    def test_random_bytes_exit_2(self):
        path = self.write(b"GARBAGE!" * 4)
        r = run_inspect(path, "--json")
        self.assertEqual(r.returncode, 2)
        self.assertIn("lockstep: error:", r.stderr)

    def test_missing_file_exit_2(self):
        r = run_inspect("/nonexistent/dir/x.safetensors")
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot open", r.stderr)


if __name__ == "__main__":
    if not os.access(LOCKSTEP, os.X_OK):
        sys.exit(f"lockstep binary not found or not executable: {LOCKSTEP}")
    result = unittest.main(exit=False, verbosity=2).result
    ok = result.wasSuccessful()
    skipped = len(result.skipped)
    print(f"test_safetensors_interop: {'OK' if ok else 'FAILED'} "
          f"({result.testsRun} run, {len(result.failures) + len(result.errors)} failed, {skipped} skipped)")
    sys.exit(0 if ok else 1)
