#!/usr/bin/env python3
"""End-to-end checks of how `lockstep` treats hostile input, odd output targets, full disks and
signals: each test holds one rule of the README's error-handling paragraph (exit 2 for input the
user can fix, 1 for other failures, every output written completely or not at all, nothing but
regular files replaced, no temporary file left behind).

Usage: python3 tests/py/test_cli_hardening.py PATH_TO_lockstep [unittest args]
Seeds are fresh per run (printed in failure messages); set LOCKSTEP_TEST_SEED to replay one.
"""
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contract_ref as ref  # noqa: E402
from st_files import raw_file, read_st  # noqa: E402

BIN = None
BASE_SEED = int(os.environ.get("LOCKSTEP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
F32_MAX = float(np.finfo(np.float32).max)
E4M3_EDGE = np.float32(np.ldexp(248.0, 120))  # MXFP8 E4M3 elements overflow from here on


def default_signals():
    """Child setup: SIGINT/SIGTERM back to their default action (a shell that starts the test
    runner in the background ignores SIGINT, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run(*args, preexec=None, timeout=120):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec)


class Case(unittest.TestCase):
    maxDiff = 4000

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="lockstep_hard_")
        self.tmp = self._tmp.name
        self.inp = self.path("in.safetensors")
        save_file({"w": np.linspace(-3, 3, 64 * 64, dtype=np.float32).reshape(64, 64)}, self.inp)

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)

    def listing(self):
        return sorted(os.listdir(self.tmp))

    def assert_refused(self, p, *needles, rc=2):
        self.assertEqual(p.returncode, rc, f"stdout={p.stdout!r} stderr={p.stderr!r}")
        for n in needles:
            self.assertIn(n, p.stderr)

    def assert_no_temporaries(self):
        self.assertEqual([f for f in self.listing() if ".tmp." in f], [])


# ---- 1. output targets that are not regular files ---------------------------------------------

class OutputTargets(Case):
    def make_device(self, name, minor):
        """A character device like /dev/null (1, 3) or /dev/full (1, 7), made in the test folder:
        the real ones are never used as targets, so a regression cannot replace them."""
        path = self.path(name)
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        except PermissionError:
            self.skipTest("creating device nodes needs root (CAP_MKNOD)")
        return path

    def test_device_nodes_are_refused_and_kept(self):
        for name, minor in (("null", 3), ("full", 7)):
            dev = self.make_device(name, minor)
            before = os.stat(dev)
            for args in (["quantize", self.inp, "-o", dev, "--format", "nvfp4"],
                         ["quantize", self.inp, "-o", self.path("q.st"), "--format", "nvfp4", "--run-meta", dev],
                         ["gemm", "--a", self.inp, "--w", self.inp, "-o", dev],
                         ["sweep", "--rows", "16", "--cols", "64", "--run-meta", dev]):
                with self.subTest(dev=name, cmd=args[0]):
                    self.assert_refused(run(*args), dev, "is a character device")
                    after = os.stat(dev)
                    self.assertTrue(stat.S_ISCHR(after.st_mode), f"{dev} was replaced by a regular file")
                    self.assertEqual(after.st_rdev, before.st_rdev)
        self.assertEqual(self.listing(), ["full", "in.safetensors", "null"])

    def test_fifo_socket_and_directory_are_refused(self):
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        sock_path = self.path("sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(sock.close)
        sock.bind(sock_path)
        os.mkdir(self.path("dir"))
        for target, kind in ((fifo, "is a FIFO"), (sock_path, "is a socket"), (self.path("dir"), "is a directory")):
            with self.subTest(target=target):
                self.assert_refused(run("quantize", self.inp, "-o", target, "--format", "fp8"), kind)
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode))
        self.assertTrue(stat.S_ISSOCK(os.stat(sock_path).st_mode))
        self.assertEqual(self.listing(), ["dir", "fifo", "in.safetensors", "sock"])

    def test_symbolic_link_is_written_through(self):
        real, link = self.path("real.st"), self.path("link.st")
        with open(real, "wb") as f:
            f.write(b"old")
        os.symlink(real, link)
        p = run("quantize", self.inp, "-o", link, "--format", "nvfp4")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(os.path.islink(link))
        got, _ = read_st(real)
        self.assertIn("w.qdata", got)


# ---- 2. every output path validated before any work; all outputs or none ------------------------

class OutputsAllOrNone(Case):
    def commands(self, out, meta):
        q = self.path("q.st")
        run("quantize", self.inp, "-o", q, "--format", "mxfp8")
        return {"quantize": ["quantize", self.inp, "-o", out, "--format", "nvfp4", "--run-meta", meta],
                "dequantize": ["dequantize", q, "-o", out, "--run-meta", meta],
                "gemm": ["gemm", "--a", self.inp, "--w", self.inp, "-o", out, "--run-meta", meta],
                "sweep": ["sweep", "--rows", "16", "--cols", "64", "--run-meta", meta]}

    def test_bad_run_meta_path_fails_before_any_work(self):
        out = self.path("out.st")
        for name, args in self.commands(out, "/no/such/dir/m.json").items():
            with self.subTest(cmd=name):
                p = run(*args)
                self.assert_refused(p, "--run-meta", "/no/such/dir", "No such file or directory")
                self.assertNotIn("tmp", p.stderr)
                self.assertFalse(os.path.exists(out), "the main output was written")
                self.assertEqual(p.stdout, "", "work was done before the path was checked")
        self.assertEqual(self.listing(), ["in.safetensors", "q.st"])

    def test_bad_output_path_fails_before_any_work(self):
        meta = self.path("m.json")
        for name, args in self.commands("/no/such/dir/out.st", meta).items():
            if name == "sweep":
                continue
            with self.subTest(cmd=name):
                self.assert_refused(run(*args), "-o", "/no/such/dir")
                self.assertFalse(os.path.exists(meta))

    def test_one_path_for_two_outputs_is_refused(self):
        out = self.path("out.st")
        self.assert_refused(run("quantize", self.inp, "-o", out, "--format", "fp8", "--run-meta", out),
                            "-o and --run-meta name the same file")
        self.assertFalse(os.path.exists(out))

    def test_write_failure_exits_1_and_leaves_neither_output(self):
        # The file size limit makes write(2) fail (EFBIG) as a full disk (ENOSPC) would. The limit
        # lies between the two outputs' sizes: one of the two temporaries is complete, the other
        # is not, so both must be dropped.
        save_file({"w": np.ones((1, 16), np.float32)}, self.inp)
        out, meta = self.path("out.st"), self.path("m.json")
        self.assertEqual(run("quantize", self.inp, "-o", out, "--format", "fp8", "--run-meta", meta).returncode, 0)
        small, big = sorted((os.path.getsize(out), os.path.getsize(meta)))
        self.assertLess(small, big - 16, "precondition: the outputs differ in size")
        os.remove(out)
        os.remove(meta)
        limit = (small + big) // 2

        def limited():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        p = run("quantize", self.inp, "-o", out, "--format", "fp8", "--run-meta", meta, preexec=limited)
        self.assert_refused(p, "lockstep: failed:", "File too large", rc=1)
        self.assertEqual(self.listing(), ["in.safetensors"])
        p = run("quantize", self.inp, "-o", out, "--format", "fp8", preexec=lambda: (
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN), resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))))
        self.assert_refused(p, "lockstep: failed:", "write failed", rc=1)
        self.assertEqual(self.listing(), ["in.safetensors"])


# ---- 3. MXFP8 near FLT_MAX ---------------------------------------------------------------------

class NearFltMax(Case):
    def test_dequantize_counts_values_that_overflow(self):
        seed = BASE_SEED * 1000 + 3
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((32, 64)).astype(np.float32)
        hot = rng.choice(x.size, size=7, replace=False)
        x.flat[hot] = np.where(rng.random(7) < 0.5, -1, 1) * rng.uniform(float(E4M3_EDGE), F32_MAX, 7).astype(np.float32)
        save_file({"act": x}, self.inp)
        q, dq = self.path("q.st"), self.path("dq.st")
        self.assertEqual(run("quantize", self.inp, "-o", q, "--format", "mxfp8").returncode, 0)
        p = run("dequantize", q, "-o", dq)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("7 value(s) overflowed to +-Inf ('act' 7)", p.stdout, f"seed {seed}")
        self.assertIn("tensor 'act' (mxfp8): 7 of 2048 value(s) dequantize to +-Inf", p.stderr)
        got = np.frombuffer(read_st(dq)[0]["act"][2], np.float32)
        self.assertEqual(sorted(np.flatnonzero(np.isinf(got))), sorted(hot), f"seed {seed}")
        # the independent NumPy oracle agrees on the bytes, Inf included
        r = ref.mxfp8_quantize(x, False, "e4m3")
        self.assertEqual(got.tobytes(), ref.mxfp8_dequantize(r["qdata"], r["block_scale"], False, "e4m3").tobytes())

    def test_sweep_reports_overflow_instead_of_a_number(self):
        x = np.full((4, 64), 0.25, np.float32)
        x[2, :] = F32_MAX
        save_file({"x": x}, self.inp)
        p = run("sweep", self.inp, "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = json.loads(p.stdout)["tensors"][0]["results"]
        e2m1_mx = [r for r in rows if r["format"] == "E2M1" and r["scale"] == "E8M0"][0]
        self.assertEqual(e2m1_mx["snr_db"], "overflow")
        self.assertEqual(e2m1_mx["rel_l2"], "overflow")
        self.assertEqual(e2m1_mx["overflow"], 64)
        self.assertEqual(e2m1_mx["worst_row"], {"row": 2, "rel_l2": "overflow"})
        for r in rows:
            self.assertNotIn(r["snr_db"], ("inf", "-inf"), r)
        text = run("sweep", self.inp).stdout
        self.assertRegex(text, r"E2M1/E8M0\s+overflow\s+overflow")


# ---- 4. dequantize --dtype source ---------------------------------------------------------------

class DequantizeSourceDtype(Case):
    def test_f16_source_comes_back_as_f16(self):
        seed = BASE_SEED * 1000 + 4
        x = (np.random.default_rng(seed).standard_normal((16, 64)) * 100).astype(np.float16)
        save_file({"h": x}, self.inp)
        q, dq = self.path("q.st"), self.path("dq.st")
        self.assertEqual(run("quantize", self.inp, "-o", q, "--format", "nvfp4", "--scaling", "per_row").returncode, 0)
        p = run("dequantize", q, "-o", dq, "--dtype", "source")
        self.assertEqual(p.returncode, 0, p.stderr)
        dtype, shape, b = read_st(dq)[0]["h"]
        self.assertEqual((dtype, shape), ("F16", [16, 64]))
        r = ref.nvfp4_quantize(x.astype(np.float32), "per_row")
        want = ref.nvfp4_dequantize(r["qdata"], r["block_scale"], r["amax"]).astype(np.float16)  # RNE
        self.assertEqual(b, want.tobytes(), f"seed {seed}")

    def test_f16_overflow_is_counted(self):
        # MXFP8 of an F16 65504: scale 2^8 (65504 / 448 rounds up), element 255.875 rounds to 256,
        # so x_hat = 65536: finite in fp32, beyond F16's range (>= 65520) and so Inf there.
        save_file({"h": np.full((1, 32), 65504, np.float16)}, self.inp)
        q, dq = self.path("q.st"), self.path("dq.st")
        self.assertEqual(run("quantize", self.inp, "-o", q, "--format", "mxfp8").returncode, 0)
        p = run("dequantize", q, "-o", dq, "--dtype", "f32")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("overflowed", p.stdout)
        self.assertEqual(set(np.frombuffer(read_st(dq)[0]["h"][2], np.float32)), {65536.0})
        p = run("dequantize", q, "-o", dq, "--dtype", "source")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("32 value(s) overflowed to +-Inf ('h' 32)", p.stdout)
        self.assertIn("in F16", p.stderr)
        got = np.frombuffer(read_st(dq)[0]["h"][2], np.float16)
        self.assertTrue(np.isposinf(got).all())


# ---- 5, 6. already-quantized input, empty tensor names -------------------------------------------

class RefusedInputs(Case):
    def test_quantized_file_is_refused_naming_the_tensor(self):
        for first in ("nvfp4", "mxfp8", "fp8"):
            q, qq = self.path(f"{first}.st"), self.path("again.st")
            args = ["quantize", self.inp, "-o", q, "--format", first]
            if first == "fp8":
                args += ["--scaling", "block_1x128"]  # its scale_inv is a 2-D F32 matrix
            self.assertEqual(run(*args).returncode, 0)
            for second in ("nvfp4", "mxfp8", "fp8"):
                with self.subTest(first=first, second=second):
                    self.assert_refused(run("quantize", q, "-o", qq, "--format", second),
                                        q, "tensor 'w' is already quantized", f"({first}")
                    self.assertFalse(os.path.exists(qq))

    def test_empty_tensor_name_is_refused_with_the_file_name(self):
        bad = self.path("empty_name.st")
        with open(bad, "wb") as f:
            f.write(raw_file({"": {"dtype": "F32", "shape": [1, 16], "data_offsets": [0, 64]}}, bytes(64)))
        for args in (["quantize", bad, "-o", self.path("o.st")], ["inspect", bad], ["sweep", bad]):
            with self.subTest(cmd=args[0]):
                self.assert_refused(run(*args), bad, "empty name")
        self.assertFalse(os.path.exists(self.path("o.st")))


# ---- 7. describe --layers -------------------------------------------------------------------------

class DescribeLayers(Case):
    def test_layer_count_is_bounded(self):
        t0 = time.monotonic()
        p = run("describe", "nvfp4_per_token", "--layers", "100000000", "--json", timeout=30)
        self.assert_refused(p, "--layers '100000000'", "1 to 1024")
        self.assertLess(time.monotonic() - t0, 10)
        self.assert_refused(run("describe", "--layers", "1025"), "1 to 1024")
        p = run("describe", "nvfp4_per_token", "--layers", "1024", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(json.loads(p.stdout)["layers"]), 1024)


# ---- 8. signals during a write --------------------------------------------------------------------

class Signals(Case):
    def interrupt_write(self, sig):
        """Quantizes a file with a large pass-through tensor and sends `sig` once the temporary
        output file exists (the write of some hundred MB takes a while, so it is caught mid-way)."""
        big = self.path("big.st")
        if not os.path.exists(big):
            save_file({"w": np.ones((16, 64), np.float32), "blob": np.zeros(1 << 28, np.uint8)}, big)
        out = self.path("out.st")
        with open(out, "wb") as f:
            f.write(b"previous output")
        child = subprocess.Popen([BIN, "quantize", big, "-o", out, "--format", "nvfp4"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_signals)
        seen = None
        deadline = time.monotonic() + 60
        while seen is None and child.poll() is None and time.monotonic() < deadline:
            seen = next((f for f in os.listdir(self.tmp) if f.startswith(".out.st.tmp.")), None)
        if seen is not None:
            child.send_signal(sig)
        _, err = child.communicate(timeout=60)
        self.assertIsNotNone(seen, f"the write finished before a temporary was seen (rc {child.returncode}): {err!r}")
        return child.returncode, out

    def test_sigterm_and_sigint_remove_the_temporary(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with self.subTest(signal=sig.name):
                rc, out = self.interrupt_write(sig)
                self.assertEqual(rc, -sig, "the process must still die of the signal")
                self.assert_no_temporaries()
                with open(out, "rb") as f:
                    self.assertEqual(f.read(), b"previous output")


# ---- 9. as strict as the reference reader and the README ------------------------------------------

class Strictness(Case):
    def test_unindexed_bytes_are_refused(self):
        gap = raw_file({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                        "b": {"dtype": "U8", "shape": [1], "data_offsets": [3, 4]}}, b"abcd")
        trailing = raw_file({"a": {"dtype": "F32", "shape": [1, 16], "data_offsets": [0, 64]}}, bytes(65))
        for name, data, needle in (("gap.st", gap, "gap of 1 unindexed bytes"),
                                   ("trailing.st", trailing, "1 trailing bytes")):
            path = self.path(name)
            with open(path, "wb") as f:
                f.write(data)
            for cmd in (["inspect", path], ["quantize", path, "-o", self.path("o.st")]):
                with self.subTest(file=name, cmd=cmd[0]):
                    self.assert_refused(run(*cmd), path, needle)

    def test_eps_must_be_a_finite_fp8_floor(self):
        out = self.path("o.st")
        for eps in ("-1", "nan", "inf", "-inf", "1e50", "1e-50"):
            with self.subTest(eps=eps):
                self.assert_refused(run("quantize", self.inp, "-o", out, "--format", "fp8", "--eps", eps), "--eps")
        for fmt in ("nvfp4", "mxfp8"):
            with self.subTest(fmt=fmt):
                self.assert_refused(run("quantize", self.inp, "-o", out, "--format", fmt, "--eps", "0.1"),
                                    "--eps applies to fp8")
        self.assertFalse(os.path.exists(out))
        self.assertEqual(run("quantize", self.inp, "-o", out, "--format", "fp8", "--eps", "0.1").returncode, 0)

    def test_seeds_are_exact_unsigned_integers(self):
        out, meta = self.path("o.st"), self.path("m.json")
        for flag, value in (("--seed", "-1"), ("--seed", "1e23"), ("--seed", "0x10"), ("--seed", "1.5"),
                            ("--seed", "18446744073709551616"), ("--stream", "-1"), ("--stream", "4294967296")):
            with self.subTest(flag=flag, value=value):
                self.assert_refused(run("quantize", self.inp, "-o", out, "--format", "nvfp4", "--stochastic",
                                        flag, value), f"{flag} '{value}'")
        self.assert_refused(run("sweep", "--seed", "-1"), "--seed '-1'")
        p = run("quantize", self.inp, "-o", out, "--format", "nvfp4", "--stochastic", "--seed",
                "18446744073709551615", "--stream", "4294967295", "--run-meta", meta)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(meta) as f:
            seeds = json.load(f)["seeds"]
        self.assertEqual(seeds, {"stochastic_rounding": 18446744073709551615, "stream": 4294967295})

    def test_recipe_files_say_their_forward_and_respect_quantize_rules(self):
        no_fprop, block2d = self.path("no_fprop.json"), self.path("b2d.json")
        with open(no_fprop, "w") as f:
            json.dump({"name": "x", "backward_mode": "quantized"}, f)
        with open(block2d, "w") as f:
            json.dump({"fprop": {"activation": {"format": "nvfp4"},
                                 "weight": {"format": "nvfp4", "scaling": "per_row", "block2d": True}}}, f)
        self.assert_refused(run("describe", "--recipe-file", no_fprop), no_fprop, "missing 'fprop'")
        self.assert_refused(run("describe", "--recipe-file", block2d), "fprop.weight: block2d", "per_row")
        huge = self.path("huge.json")  # fuzz_recipe's finding: a JSON error, exit 2 (not 1)
        with open(huge, "w") as f:
            f.write('{"fprop": {}, "coverage": {"first_n_bf16": 1e999}}')
        self.assert_refused(run("describe", "--recipe-file", huge), huge, "not valid JSON")
        # and the quantizer refuses the same pair, for the same reason (the format table's)
        self.assert_refused(run("quantize", self.inp, "-o", self.path("o.st"), "--format", "nvfp4",
                                "--scaling", "per_row", "--block2d"), "cannot use per_row outer scales")

    def test_shape_and_metadata_errors_name_the_file(self):
        bad = self.path("odd.st")
        save_file({"odd": np.ones((4, 24), np.float32)}, bad)
        self.assert_refused(run("quantize", bad, "-o", self.path("o.st"), "--format", "nvfp4"),
                            bad, "tensor 'odd'", "cols % 16")
        self.assert_refused(run("gemm", "--a", bad, "--w", bad, "-o", self.path("o.st"), "--format", "mxfp8"),
                            bad, "cols % 32")
        narrow = self.path("narrow.st")
        save_file({"w": np.ones((8, 32), np.float32)}, narrow)
        self.assert_refused(run("gemm", "--a", self.inp, "--w", narrow, "-o", self.path("o.st")),
                            "K mismatch", self.inp, narrow)
        # forged metadata: a quantized file whose block scales were removed
        q = self.path("q.st")
        self.assertEqual(run("quantize", self.inp, "-o", q, "--format", "nvfp4").returncode, 0)
        parts, meta = read_st(q)
        del parts["w.block_scale"]
        header, data, off = {"__metadata__": meta}, b"", 0
        for k, (dt, shape, b) in parts.items():
            header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
            data += b
            off += len(b)
        forged = self.path("forged.st")
        with open(forged, "wb") as f:
            f.write(raw_file(header, data))
        self.assert_refused(run("dequantize", forged, "-o", self.path("o.st")), forged, "missing part w.block_scale")
        meta["lockstep.w.shape"] = "64,x"
        header["__metadata__"] = meta
        with open(forged, "wb") as f:
            f.write(raw_file(header, data))
        self.assert_refused(run("dequantize", forged, "-o", self.path("o.st")), forged, "bad shape metadata")

    def test_unknown_command_is_named(self):
        p = run("frobnicate", "x")
        self.assert_refused(p, "unknown command 'frobnicate'", "quantize")
        self.assertNotIn("A subcommand is required", p.stderr)
        self.assertEqual(run("--version").returncode, 0)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_cli_hardening.py PATH_TO_lockstep [unittest args]")
    BIN = os.path.abspath(sys.argv.pop(1))
    print(f"lockstep binary {BIN}; base seed {BASE_SEED} (LOCKSTEP_TEST_SEED to replay)", flush=True)
    unittest.main(verbosity=2)
