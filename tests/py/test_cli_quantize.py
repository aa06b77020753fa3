#!/usr/bin/env python3
"""End-to-end tests of `lockstep quantize` / `dequantize` / `sweep` against contract_ref.py, an
independent NumPy implementation of CONTRACT.md. Every quantized byte is compared.

Usage: python3 tests/py/test_cli_quantize.py PATH_TO_lockstep [unittest args]
Seeds are fresh per run (printed in failure messages); set LOCKSTEP_TEST_SEED to replay one.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contract_ref as ref  # noqa: E402
from st_files import read_st  # noqa: E402

BIN = None
BF16 = ml_dtypes.bfloat16
F32 = np.float32
BASE_SEED = int(os.environ.get("LOCKSTEP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
_seed_counter = [0]


def fresh_seed():
    _seed_counter[0] += 1
    return BASE_SEED * 1000 + _seed_counter[0]


def run(*args, check=False):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"lockstep {' '.join(map(str, args))} -> rc {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def heavy(rng, shape):
    return (rng.standard_t(1.5, size=shape) * np.exp(rng.standard_normal(shape))).astype(np.float32)


def as_dtype(x, dt):
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32).astype(BF16 if dt == "bf16" else np.float32))


def f32_bits_equal(a_bytes, b_bytes):
    """fp32 buffers equal bit for bit, except that any NaN equals any NaN (NaN payloads are not contract)."""
    a = np.frombuffer(a_bytes, dtype=np.float32)
    b = np.frombuffer(b_bytes, dtype=np.float32)
    if a.shape != b.shape:
        return False, None
    same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
    bad = np.flatnonzero(~same)
    return bad.size == 0, bad


def expected_parts(name, fmt, x, scaling, block2d=False, colwise=False, pow2=False, elem="e4m3", eps=0.0):
    """{tensor name: (dtype, shape, bytes)} that the contract prescribes for quantizing x."""
    rows, cols = x.shape
    if fmt == "nvfp4":
        r = ref.nvfp4_quantize(x, scaling, block2d)
        return {f"{name}.qdata": ("U8", [rows, cols // 2], r["qdata"].tobytes()),
                f"{name}.block_scale": ("F8_E4M3", [rows, cols // 16], r["block_scale"].tobytes()),
                f"{name}.amax": ("F32", list(r["amax"].shape), r["amax"].astype(np.float32).tobytes())}, r
    if fmt == "mxfp8":
        r = ref.mxfp8_quantize(x, colwise, elem)
        qdt = "F8_E4M3" if elem == "e4m3" else "F8_E5M2"
        out = {f"{name}.qdata": (qdt, [rows, cols], r["qdata"].tobytes()),
               f"{name}.block_scale": ("F8_E8M0", [rows, cols // 32], r["block_scale"].tobytes())}
        if colwise:
            out[f"{name}.qdata_colwise"] = (qdt, [rows, cols], r["qdata_colwise"].tobytes())
            out[f"{name}.block_scale_colwise"] = ("F8_E8M0", [rows // 32, cols], r["block_scale_colwise"].tobytes())
        return out, r
    if fmt == "fp8":
        r = ref.fp8_quantize(x, scaling, pow2, eps=F32(eps))
        return {f"{name}.qdata": ("F8_E4M3", [rows, cols], r["qdata"].tobytes()),
                f"{name}.scale_inv": ("F32", list(r["scale_inv"].shape), r["scale_inv"].tobytes())}, r
    raise ValueError(fmt)


def expected_dequant(fmt, r, scaling, colwise=False, elem="e4m3"):
    if fmt == "nvfp4":
        return ref.nvfp4_dequantize(r["qdata"], r["block_scale"], r["amax"])
    if fmt == "mxfp8":
        return ref.mxfp8_dequantize(r["qdata"], r["block_scale"], False, elem)
    return ref.fp8_dequantize(r["qdata"], r["scale_inv"], scaling)


class CliCase(unittest.TestCase):
    maxDiff = 4000

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="lockstep_py_")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)

    def describe_diff(self, key, exp, got, x, ctx):
        edt, eshape, eb = exp
        gdt, gshape, gb = got
        msg = [f"{ctx}: {key}"]
        if (edt, eshape) != (gdt, gshape):
            msg.append(f"dtype/shape expected {edt} {eshape}, got {gdt} {gshape}")
            return "\n".join(msg)
        if edt == "F32":
            ok, bad = f32_bits_equal(eb, gb)
            if ok:
                return None
            e = np.frombuffer(eb, dtype=np.float32)
            g = np.frombuffer(gb, dtype=np.float32)
            for i in bad[:5]:
                msg.append(f"  [{i}] expected {e[i]!r} (0x{e.view(np.uint32)[i]:08x}) got {g[i]!r} (0x{g.view(np.uint32)[i]:08x})")
            msg.append(f"  {bad.size} of {e.size} differ")
            return "\n".join(msg)
        if eb == gb:
            return None
        e = np.frombuffer(eb, dtype=np.uint8)
        g = np.frombuffer(gb, dtype=np.uint8)
        bad = np.flatnonzero(e != g) if e.size == g.size else np.arange(min(e.size, g.size))
        per_row = eshape[1] if len(eshape) == 2 else 1
        for i in bad[:5]:
            r, c = divmod(int(i), per_row)
            msg.append(f"  byte [{r},{c}] expected 0x{e[i]:02x} got 0x{g[i]:02x}")
            if x is not None and r < x.shape[0]:
                row = x[r]
                if key.endswith(".qdata") and edt == "U8":
                    vals = row[2 * c:2 * c + 2]
                elif key.endswith("block_scale"):
                    vals = row[c * 16:(c + 1) * 16] if edt == "F8_E4M3" else row[c * 32:(c + 1) * 32]
                else:
                    vals = row[c:c + 1]
                msg.append(f"    input row {r} values {np.asarray(vals, dtype=np.float32).tolist()[:32]}")
        msg.append(f"  {bad.size} of {e.size} bytes differ")
        return "\n".join(msg)

    def quantize_and_check(self, tensors, fmt, scaling=None, block2d=False, colwise=False, pow2=False,
                           elem="e4m3", allow_nonfinite=False, seed=None, dequant=True, extra=None, eps=None):
        """tensors: {name: 2-D fp32 or bf16 array}. Runs quantize (+ dequantize) and compares all bytes."""
        ctx = f"[seed {seed} base {BASE_SEED}] {fmt} {scaling} block2d={block2d} colwise={colwise} pow2={pow2}"
        inp, outp, dqp = self.path("in.safetensors"), self.path("out.safetensors"), self.path("dq.safetensors")
        all_t = dict(tensors)
        if extra:
            all_t.update(extra)
        save_file(all_t, inp, metadata={"origin": "pytest"})
        args = ["quantize", inp, "-o", outp, "--format", fmt]
        if scaling:
            args += ["--scaling", scaling]
        if block2d:
            args.append("--block2d")
        if colwise:
            args.append("--colwise")
        if pow2:
            args.append("--pow2")
        if elem != "e4m3":
            args += ["--elem", elem]
        if allow_nonfinite:
            args.append("--allow-nonfinite")
        if eps is not None:
            args += ["--eps", repr(float(eps))]
        run(*args, check=True)
        got, meta = read_st(outp)
        sc_name = scaling or ("block_1x32" if fmt == "mxfp8" else "per_tensor")
        self.assertEqual(meta.get("lockstep.contract"), "1", ctx)
        self.assertEqual(meta.get("origin"), "pytest", ctx + ": input metadata kept")
        errors = []
        refs = {}
        expected_names = set()
        for name, x in tensors.items():
            xf = ref.widen(x)
            exp, r = expected_parts(name, fmt, xf if fmt != "fp8" else x, sc_name, block2d, colwise, pow2, elem, eps or 0.0)
            refs[name] = (xf, r)
            self.assertEqual(meta.get(f"lockstep.{name}.format"), fmt, ctx)
            self.assertEqual(meta.get(f"lockstep.{name}.scaling"), sc_name, ctx)
            for key, e in exp.items():
                expected_names.add(key)
                if key not in got:
                    errors.append(f"{ctx}: missing {key}; file has {sorted(got)}")
                    continue
                d = self.describe_diff(key, e, got[key], xf, ctx)
                if d:
                    errors.append(d)
        for name, t in (extra or {}).items():
            expected_names.add(name)
            self.assertIn(name, got, ctx)
            self.assertEqual(got[name][2], np.ascontiguousarray(t).tobytes(), f"{ctx}: passthrough {name}")
        self.assertEqual(sorted(got), sorted(expected_names), ctx)
        if errors:
            self.fail("\n".join(errors))
        if dequant:
            run("dequantize", outp, "-o", dqp, check=True)
            dq, dmeta = read_st(dqp)
            for name, (xf, r) in refs.items():
                e = expected_dequant(fmt, r, sc_name, elem=elem)
                self.assertIn(name, dq, ctx)
                dt, shape, b = dq[name]
                self.assertEqual((dt, shape), ("F32", list(e.shape)), ctx)
                ok, bad = f32_bits_equal(e.tobytes(), b)
                if not ok:
                    g = np.frombuffer(b, dtype=np.float32)
                    ef = e.reshape(-1)
                    lines = [f"{ctx}: dequantize {name}: {bad.size} of {ef.size} differ"]
                    for i in bad[:5]:
                        lines.append(f"  [{divmod(int(i), e.shape[1])}] expected {ef[i]!r} got {g[i]!r} (input {xf.reshape(-1)[i]!r})")
                    self.fail("\n".join(lines))
            for name, t in (extra or {}).items():
                self.assertEqual(dq[name][2], np.ascontiguousarray(t).tobytes(), f"{ctx}: dequantize passthrough {name}")
        return got, refs


# ------------------------------------------------------------------------------------- NVFP4

def nvfp4_tie_tensor(dt, j):
    """[2, 32]: A = 2688 * 2^-j so S_enc = 2^j exactly; block (0,1) has b = 6 * 2^-j so s_b = 1.0 and
    enc = 2^j; its elements are E2M1 ties / 2^j so x * enc lands exactly on every tie."""
    s = 2.0 ** -j
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 6.0, -0.0]
    x = np.zeros((2, 32), dtype=np.float32)
    x[0, 0] = 2688 * s
    x[0, 1:16] = np.linspace(-100, 100, 15) * s
    x[0, 16:32] = np.array(ties) * s
    x[1, 0:16] = np.array(ties[::-1]) * s
    x[1, 16:32] = np.array(ties) * s
    return as_dtype(x, dt)


def e4m3_tie_block_max(k, mid):
    """A float32 b with RN(b * k) == mid exactly (an E4M3 midpoint), or None."""
    b = F32(mid) / k
    for _ in range(64):
        p = b * k
        if p == F32(mid):
            return b
        b = np.nextafter(b, F32(np.inf) if p < F32(mid) else F32(0))
    # scan a neighbourhood
    b0 = F32(mid) / k
    for step in range(-40, 41):
        c = b0
        for _ in range(abs(step)):
            c = np.nextafter(c, F32(np.inf) if step > 0 else F32(0))
        if c * k == F32(mid):
            return c
    return None


class Nvfp4Test(CliCase):
    def test_random_normal_and_heavy(self):
        for dt in ("f32", "bf16"):
            for scaling, block2d in (("per_tensor", False), ("per_row", False), ("per_tensor", True)):
                seed = fresh_seed()
                rng = np.random.default_rng(seed)
                t = {"w.normal": as_dtype(rng.standard_normal((32, 64)) * 0.02, dt),
                     "w.heavy": as_dtype(heavy(rng, (16, 48)), dt),
                     "w.r16c16": as_dtype(rng.standard_normal((16, 16)), dt)}
                if not block2d:
                    t["w.row1"] = as_dtype(heavy(rng, (1, 16)), dt)
                    t["w.row3"] = as_dtype(rng.standard_normal((3, 32)) * 1e3, dt)
                with self.subTest(dt=dt, scaling=scaling, block2d=block2d, seed=seed):
                    self.quantize_and_check(t, "nvfp4", scaling, block2d=block2d, seed=seed,
                                            extra={"bias": np.arange(5, dtype=np.float32),
                                                   "ids": np.arange(6, dtype=np.int32).reshape(2, 3)})

    def test_large_993x512(self):
        seed = fresh_seed()
        rng = np.random.default_rng(seed)
        x = heavy(rng, (993, 512))
        x[5, :] = 0.0
        x[7, 32:48] = 0.0
        self.quantize_and_check({"big": x}, "nvfp4", "per_row", seed=seed)

    def test_zeros_and_negative_zero(self):
        for dt in ("f32", "bf16"):
            for scaling in ("per_tensor", "per_row"):
                z = np.zeros((16, 32), dtype=np.float32)
                nz = np.full((4, 32), -0.0, dtype=np.float32)
                mixed = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
                mixed[:, 16:32] = 0.0       # an all-zero block in every row
                mixed[3, :] = 0.0           # an all-zero row
                mixed[4, 0:16] = -0.0       # an all -0.0 block
                mixed[6, 5] = -0.0
                with self.subTest(dt=dt, scaling=scaling):
                    self.quantize_and_check({"zero": as_dtype(z, dt), "negzero": as_dtype(nz, dt),
                                             "mixed": as_dtype(mixed, dt)}, "nvfp4", scaling)
            self.quantize_and_check({"zero": as_dtype(np.zeros((32, 32), np.float32), dt),
                                     "mixed": as_dtype(mixed, dt)}, "nvfp4", "per_tensor", block2d=True)

    def test_dtype_max_and_subnormal(self):
        fmax = np.finfo(np.float32).max
        bmax = float(ref.BF16_MAX_AS_F32)
        rng = np.random.default_rng(2)
        for dt, mx in (("f32", fmax), ("bf16", bmax)):
            x = rng.standard_normal((4, 32)).astype(np.float32)
            x[0, 3] = mx
            x[1, 20] = -mx
            x[2, :16] = mx
            for scaling in ("per_tensor", "per_row"):
                with self.subTest(dt=dt, scaling=scaling):
                    self.quantize_and_check({"mx": as_dtype(x, dt)}, "nvfp4", scaling)
        sub = (rng.standard_normal((4, 32)) * 1e-39).astype(np.float32)   # fp32 subnormals
        sub[1, :] = (rng.standard_normal(32) * 1e-44).astype(np.float32)
        sub[2, :16] = np.float32(1.4e-45)
        mixed = rng.standard_normal((4, 32)).astype(np.float32)
        mixed[1] = sub[0]
        bsub = (rng.standard_normal((4, 32)) * 1e-39).astype(BF16)         # bf16 subnormals
        self.assertTrue(np.all(np.abs(sub[sub != 0]) < np.finfo(np.float32).tiny))
        for scaling in ("per_tensor", "per_row"):
            with self.subTest(case="subnormal", scaling=scaling):
                self.quantize_and_check({"sub": sub, "mixed": mixed, "bsub": bsub}, "nvfp4", scaling)

    def test_e2m1_ties(self):
        for dt in ("f32", "bf16"):
            for j in (0, 3, -4, 10):
                x = nvfp4_tie_tensor(dt, j)
                # the reference must see every tie exactly (guards the construction itself)
                xf = ref.widen(x)
                S_enc = ref.nvfp4_s_enc(ref.amax(xf))
                self.assertEqual(float(S_enc), 2.0 ** j)
                r = ref.nvfp4_quantize(xf, "per_tensor")
                self.assertEqual(int(r["block_scale"][0, 1]), 0x38)   # E4M3 1.0
                prod = xf[0, 16:32] * F32(2.0 ** j)
                self.assertEqual(sorted(set(np.abs(prod[:14]).tolist())), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
                codes = ref.nvfp4_unpack(r["qdata"])[0, 16:32].tolist()
                self.assertEqual(codes, [0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 7, 8])
                with self.subTest(dt=dt, j=j):
                    self.quantize_and_check({"ties": x}, "nvfp4", "per_tensor")

    def test_e4m3_scale_ties(self):
        # A = 2688 -> S_enc = 1, so the block scale is E4M3(RN(b * fl(1/6))); pick b on E4M3 midpoints.
        k = F32(1.0) * ref.ONE_SIXTH
        codes = np.arange(0x01, 0x7E, dtype=np.uint8)
        vals = ref.e4m3_decode(codes).astype(np.float64)
        mids = (vals[:-1] + vals[1:]) / 2
        rows = []
        for m in mids[::3]:
            b = e4m3_tie_block_max(k, m)
            if b is not None and b < 2688:
                row = np.zeros(32, dtype=np.float32)
                row[0] = 2688.0
                row[16] = b
                row[17:32] = np.linspace(-1, 1, 15).astype(np.float32) * b
                rows.append(row)
        self.assertGreater(len(rows), 10, "tie construction found too few block maxima")
        x = np.stack(rows)
        xf = x.copy()
        prods = xf[:, 16] * (ref.nvfp4_s_enc(F32(2688.0)) * ref.ONE_SIXTH)
        self.assertTrue(np.all(np.isin(prods.astype(np.float64), mids)))
        self.quantize_and_check({"sties": x}, "nvfp4", "per_tensor")

    def test_formula_discriminators(self):
        """Rows built so that plausible misreadings of section 2 give different bytes: (a) s_b from
        RN(RN(b * S_enc) * fl(1/6)) instead of RN(b * RN(S_enc * fl(1/6))); (b) enc from one division
        RN(S_enc / decode(s_b)) instead of RN(1 / RN(decode(s_b) * S_dec))."""
        seed = fresh_seed()
        rng = np.random.default_rng(seed)
        vals = ref.e4m3_decode(np.arange(1, 0x7E, dtype=np.uint8)).astype(np.float64)
        mids = (vals[:-1] + vals[1:]) / 2
        ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
        rows_a, rows_b = [], []
        for _ in range(4000):
            if len(rows_a) >= 8 and len(rows_b) >= 8:
                break
            A = F32(rng.uniform(1, 1000))
            S = ref.nvfp4_s_enc(A)
            k1 = F32(S * ref.ONE_SIXTH)
            S_dec = F32(1) / S
            if len(rows_a) < 8:
                mid = F32(rng.choice(mids[20:110]))
                b = F32(mid / k1)
                for _ in range(rng.integers(0, 3)):
                    b = np.nextafter(b, F32(np.inf) if rng.random() < 0.5 else F32(0))
                c1 = ref.e4m3_encode(np.array([b * k1], F32))[0]
                c2 = ref.e4m3_encode(np.array([F32(b * S) * ref.ONE_SIXTH], F32))[0]
                if b < A and c1 != c2:
                    row = np.zeros(32, F32)
                    row[0], row[16] = A, b
                    row[17:32] = (rng.uniform(-1, 1, 15) * b).astype(F32)
                    rows_a.append(row)
            if len(rows_b) < 8:
                b = F32(rng.uniform(0.01, 1) * A)
                s_b = ref.e4m3_encode(np.array([b * k1], F32))
                dec = ref.e4m3_decode(s_b)[0]
                enc = F32(1) / F32(dec * S_dec)
                enc_alt = S / dec
                if enc != enc_alt and dec > 0:
                    t = F32(rng.choice(ties))
                    x = F32(t / enc)
                    hits = []
                    for d in range(-3, 4):
                        xx = x
                        for _ in range(abs(d)):
                            xx = np.nextafter(xx, F32(np.inf) if d > 0 else F32(0))
                        q1 = ref.e2m1_encode(np.array([xx * enc], F32))[0]
                        q2 = ref.e2m1_encode(np.array([xx * enc_alt], F32))[0]
                        if q1 != q2 and xx < b:
                            hits.append(xx)
                    if hits:
                        row = np.zeros(32, F32)
                        row[0], row[16] = A, b
                        row[17:17 + len(hits)] = hits
                        rows_b.append(row)
        self.assertGreaterEqual(len(rows_a), 4, f"seed {seed}")
        self.assertGreaterEqual(len(rows_b), 4, f"seed {seed}")
        self.quantize_and_check({"order": np.stack(rows_a), "encdiv": np.stack(rows_b)}, "nvfp4", "per_row", seed=seed)

    def test_scale_underflow(self):
        # block amax tiny relative to A: s_b encodes to 0, enc = FLT_MAX, nonzero elements -> +-6 (codes 7 / 0xF)
        for dt in ("f32", "bf16"):
            x = np.zeros((2, 32), dtype=np.float32)
            x[:, 0] = 2688.0
            x[0, 16:32] = np.array([1e-3, -1e-3, 5e-4, -2e-5, 0.0, -0.0, 1e-7, -1e-7] * 2, dtype=np.float32)
            x[1, 16:32] = np.float32(-1e-30)
            xd = as_dtype(x, dt)
            r = ref.nvfp4_quantize(ref.widen(xd), "per_tensor")
            self.assertEqual(r["block_scale"][:, 1].tolist(), [0, 0])
            self.assertEqual(ref.nvfp4_unpack(r["qdata"])[0, 16:24].tolist(), [7, 15, 7, 15, 0, 8, 7, 15])
            with self.subTest(dt=dt):
                self.quantize_and_check({"under": xd}, "nvfp4", "per_tensor")

    def test_nonfinite_allowed(self):
        for dt in ("f32", "bf16"):
            x = np.random.default_rng(3).standard_normal((6, 32)).astype(np.float32)
            x[0, 1] = np.nan
            x[0, 2] = np.inf
            x[1, 17] = -np.inf
            x[2, :16] = np.nan            # an all-NaN block
            x[3, :] = np.nan              # an all-NaN row (per_row: A = NaN)
            x[4, 5] = -np.nan
            x[5, :] = np.inf
            for scaling in ("per_tensor", "per_row"):
                with self.subTest(dt=dt, scaling=scaling):
                    self.quantize_and_check({"nf": as_dtype(x, dt)}, "nvfp4", scaling, allow_nonfinite=True)
            y = np.random.default_rng(4).standard_normal((4, 32)).astype(np.float32)
            y[0, 0] = np.nan
            y[2, 31] = -np.inf
            with self.subTest(dt=dt, case="finite-amax NaN element"):
                got, _ = self.quantize_and_check({"nf2": as_dtype(y, dt)}, "nvfp4", "per_row", allow_nonfinite=True)
                self.assertEqual(got["nf2.qdata"][2][0] & 0xF, 0x7, "E2M1 NaN must encode as 0x7")


# ------------------------------------------------------------------------------------- MXFP8

class Mxfp8Test(CliCase):
    def test_random(self):
        for dt in ("f32", "bf16"):
            for colwise in (False, True):
                seed = fresh_seed()
                rng = np.random.default_rng(seed)
                t = {"a": as_dtype(rng.standard_normal((64, 64)), dt),
                     "h": as_dtype(heavy(rng, (32, 96)) * 1e-20, dt),
                     "s": as_dtype(rng.standard_normal((32, 32)) * 1e30, dt)}
                if not colwise:
                    t["r1"] = as_dtype(heavy(rng, (1, 32)), dt)
                with self.subTest(dt=dt, colwise=colwise, seed=seed):
                    self.quantize_and_check(t, "mxfp8", None, colwise=colwise, seed=seed)

    def test_special(self):
        fmax = np.finfo(np.float32).max
        rng = np.random.default_rng(5)
        for dt in ("f32", "bf16"):
            x = rng.standard_normal((32, 128)).astype(np.float32)
            x[:, 0:32] = 0.0                                  # zero blocks (both directions partly)
            x[0, 32] = fmax if dt == "f32" else ref.BF16_MAX_AS_F32
            x[1, 64:96] = (rng.standard_normal(32) * 1e-39).astype(np.float32)   # subnormal block
            x[2, 96:128] = np.float32(2.0 ** -127)
            x[3, 96:128] = -0.0
            # E4M3 ties: b = 256 -> e = 127 (multiplier 1), elements on E4M3 midpoints
            vals = ref.e4m3_decode(np.arange(0, 0x7E, dtype=np.uint8)).astype(np.float64)
            mids = ((vals[:-1] + vals[1:]) / 2)
            mids = mids[mids < 256][-31:].astype(np.float32)
            x[4, 32:64] = np.concatenate([[256.0], mids]).astype(np.float32) * np.where(np.arange(32) % 2, -1, 1)
            x[5, 32:64] = np.concatenate([[256.0], mids[:31]]).astype(np.float32) * np.float32(2.0 ** -70)
            r = ref.mxfp8_quantize(ref.widen(as_dtype(x, dt)))
            if dt == "f32":
                self.assertEqual(int(r["block_scale"][4, 1]), 127)
            with self.subTest(dt=dt):
                self.quantize_and_check({"sp": as_dtype(x, dt)}, "mxfp8", None, colwise=True)

    def test_nonfinite_allowed(self):
        x = np.random.default_rng(6).standard_normal((32, 64)).astype(np.float32)
        x[0, 0] = np.nan
        x[1, 1] = np.inf
        x[2, 32:64] = np.nan          # all-NaN block: e = 0xFF, elements NaN
        x[3, 40] = -np.inf
        for dt in ("f32", "bf16"):
            with self.subTest(dt=dt):
                self.quantize_and_check({"nf": as_dtype(x, dt)}, "mxfp8", None, colwise=True, allow_nonfinite=True)

    def test_e5m2_elements(self):
        seed = fresh_seed()
        rng = np.random.default_rng(seed)
        self.quantize_and_check({"e5": heavy(rng, (32, 64))}, "mxfp8", None, elem="e5m2", seed=seed)


# ------------------------------------------------------------------------------------- FP8

class Fp8Test(CliCase):
    def test_random_all_scalings(self):
        for dt in ("f32", "bf16"):
            for scaling in ("per_tensor", "per_row", "block_1x128", "block_128x128"):
                for pow2 in (False, True):
                    seed = fresh_seed()
                    rng = np.random.default_rng(seed)
                    t = {"a": as_dtype(rng.standard_normal((16, 256)), dt),
                         "h": as_dtype(heavy(rng, (130, 200)), dt),     # partial last blocks both ways
                         "r1": as_dtype(heavy(rng, (1, 16)), dt),
                         "z": as_dtype(np.zeros((3, 130), np.float32), dt)}
                    with self.subTest(dt=dt, scaling=scaling, pow2=pow2, seed=seed):
                        self.quantize_and_check(t, "fp8", scaling, pow2=pow2, seed=seed)

    def test_large_993x512(self):
        seed = fresh_seed()
        x = heavy(np.random.default_rng(seed), (993, 512))
        self.quantize_and_check({"big": x}, "fp8", "block_128x128", seed=seed)

    def test_special(self):
        fmax = np.finfo(np.float32).max
        rng = np.random.default_rng(7)
        vals = ref.e4m3_decode(np.arange(0, 0x7F, dtype=np.uint8)).astype(np.float64)
        mids = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)
        for dt in ("f32", "bf16"):
            mx = fmax if dt == "f32" else ref.BF16_MAX_AS_F32
            t = {}
            ties = np.zeros((2, 128), dtype=np.float32)           # A = 448 -> scale 1, x on midpoints
            ties[0, 0] = 448
            ties[0, 1:127] = mids
            ties[1, :126] = -mids
            ties[1, 127] = 448
            t["ties"] = as_dtype(ties, dt)
            m = rng.standard_normal((3, 64)).astype(np.float32)
            m[0, 0] = mx
            m[1, 1] = -mx
            t["max"] = as_dtype(m, dt)
            # scale = RN(448 / A) overflows -> FLT_MAX (fp32 input) or 0x7F7F (bf16 input)
            tiny = (rng.standard_normal((2, 64)) * 1e-39).astype(np.float32)
            tiny[1, :] = np.float32(1e-44)
            t["tiny"] = as_dtype(tiny, dt)
            t["negzero"] = as_dtype(np.full((2, 16), -0.0, np.float32), dt)
            for scaling in ("per_tensor", "per_row", "block_1x128"):
                for pow2 in (False, True):
                    with self.subTest(dt=dt, scaling=scaling, pow2=pow2):
                        self.quantize_and_check(t, "fp8", scaling, pow2=pow2)
        # check the fallback values themselves in the reference
        self.assertEqual(float(ref.fp8_scale(F32(1e-39), False)), float(fmax))
        self.assertEqual(float(ref.fp8_scale(F32(1e-39), True)), 3.3895313892515355e38)

    def test_eps(self):
        # A < eps -> A = eps (so an all-zero domain gets scale RN(448 / eps), not 1); NaN A stays NaN -> 1
        rng = np.random.default_rng(9)
        x = (rng.standard_normal((4, 128)) * 0.01).astype(np.float32)
        x[1, :] = 0.0
        x[2, :5] = 3.0
        for eps in (0.0625, 0.3):
            for scaling in ("per_tensor", "per_row", "block_1x128"):
                with self.subTest(eps=eps, scaling=scaling):
                    self.quantize_and_check({"e": x}, "fp8", scaling, eps=eps)
        y = x.copy()
        y[3, :] = np.nan
        self.quantize_and_check({"e": y}, "fp8", "per_row", eps=0.3, allow_nonfinite=True)

    def test_nonfinite_allowed(self):
        x = np.random.default_rng(8).standard_normal((4, 256)).astype(np.float32)
        x[0, 3] = np.nan
        x[1, 200] = np.inf            # domain A = inf -> scale 1
        x[2, :] = np.nan
        x[3, 130] = -np.inf
        for dt in ("f32", "bf16"):
            for scaling in ("per_tensor", "per_row", "block_1x128"):
                with self.subTest(dt=dt, scaling=scaling):
                    self.quantize_and_check({"nf": as_dtype(x, dt)}, "fp8", scaling, allow_nonfinite=True)


# ------------------------------------------------------------------------------------- stochastic rounding

class StochasticTest(CliCase):
    """`lockstep quantize --stochastic` (contract 1.1: one Philox4x32-10 call per four consecutive
    elements, section 5's rule) against contract_ref's own Philox and rule, byte for byte."""

    def sr_check(self, tensors, fmt, scaling, seed, stream):
        inp, outp = self.path("in.safetensors"), self.path("out.safetensors")
        save_file(tensors, inp)
        run("quantize", inp, "-o", outp, "--format", fmt, "--scaling", scaling, "--stochastic",
            "--seed", seed, "--stream", stream, "--allow-nonfinite", check=True)
        got, _ = read_st(outp)
        for name, x in tensors.items():
            ctx = f"[base {BASE_SEED}] {fmt} {scaling} seed {seed} stream {stream} {name} {x.shape} {x.dtype}"
            if fmt == "nvfp4":
                r = ref.nvfp4_quantize_sr(x, scaling, seed, stream)
                parts = {"qdata": r["qdata"], "block_scale": r["block_scale"], "amax": r["amax"]}
            else:
                r = ref.fp8_quantize_sr(x, scaling, seed, stream)
                parts = {"qdata": r["qdata"], "scale_inv": r["scale_inv"]}
            for key, arr in parts.items():
                want = np.ascontiguousarray(arr).tobytes()
                have = got[f"{name}.{key}"][2]
                if np.asarray(arr).dtype == np.float32:
                    ok, bad = f32_bits_equal(want, have)
                    self.assertTrue(ok, f"{ctx}: {key} differs at {None if bad is None else bad[:5]}")
                else:
                    e, g = np.frombuffer(want, np.uint8), np.frombuffer(have, np.uint8)
                    bad = np.flatnonzero(e != g) if e.size == g.size else None
                    self.assertEqual(have, want, f"{ctx}: {key} bytes differ at {None if bad is None else bad[:8]}")

    def fixed_tensors(self):
        """Known inputs: grid fractions at several scales, signed zeros, a NaN, an inf, and rows whose
        length is not a multiple of 4 (FP8), so calls straddle rows."""
        g = np.random.default_rng(12345)
        a = np.concatenate([np.linspace(-7.0, 7.0, 29), [0.0, -0.0, 448.0]]).astype(np.float32)
        nv = np.stack([a, a * np.float32(0.013), g.standard_normal(32).astype(np.float32)])
        nv[2, 5] = np.nan
        nv[1, 9] = np.inf
        f8 = (g.standard_normal((3, 130)) * 3.0).astype(np.float32)
        f8[0, :29] = np.linspace(-500.0, 500.0, 29)
        f8[1, 7] = -np.inf
        return nv, f8

    def test_known_answers(self):
        nv, f8 = self.fixed_tensors()
        for seed, stream in ((0, 0), (1, 7), (0x1234567890ABCDEF, 0xFFFFFFFF), (2**64 - 1, 3)):
            for dt in ("f32", "bf16"):
                with self.subTest(seed=seed, stream=stream, dt=dt):
                    for scaling in ("per_tensor", "per_row"):
                        self.sr_check({"nv": as_dtype(nv, dt)}, "nvfp4", scaling, seed, stream)
                    for scaling in ("per_tensor", "per_row", "block_1x128"):
                        self.sr_check({"f8": as_dtype(f8, dt)}, "fp8", scaling, seed, stream)

    def test_random(self):
        seed = fresh_seed()
        rng = np.random.default_rng(seed)
        t = {"a": as_dtype(heavy(rng, (64, 256)), "bf16"), "b": heavy(rng, (33, 48))}
        stream = int(rng.integers(0, 2**32))
        with self.subTest(seed=seed):
            self.sr_check(t, "nvfp4", "per_row", seed, stream)
            self.sr_check({"c": heavy(rng, (40, 100))}, "fp8", "per_tensor", seed, stream)


# ------------------------------------------------------------------------------------- errors, dequantize dtype, sweep

class SwizzledLayoutTest(CliCase):
    def test_swizzled(self):
        seed = fresh_seed()
        rng = np.random.default_rng(seed)
        cases = [("nvfp4", "per_tensor", {"a": heavy(rng, (40, 96)), "b": as_dtype(rng.standard_normal((130, 80)), "bf16")}),
                 ("nvfp4", "per_row", {"a": heavy(rng, (1, 16))}),
                 ("mxfp8", None, {"a": heavy(rng, (40, 96)), "b": as_dtype(rng.standard_normal((129, 160)), "bf16")})]
        for fmt, scaling, tensors in cases:
            inp, outp, dqp = self.path("in.safetensors"), self.path("out.safetensors"), self.path("dq.safetensors")
            save_file(tensors, inp)
            args = ["quantize", inp, "-o", outp, "--format", fmt, "--scale-layout", "swizzled"]
            if scaling:
                args += ["--scaling", scaling]
            run(*args, check=True)
            got, _ = read_st(outp)
            run("dequantize", outp, "-o", dqp, check=True)
            dq, _ = read_st(dqp)
            for name, x in tensors.items():
                ctx = f"[seed {seed}] {fmt} {scaling} swizzled {name} {x.shape}"
                exp, r = expected_parts(name, fmt, ref.widen(x), scaling or "block_1x32")
                sw = ref.swizzle_scales(r["block_scale"])
                dt, shape, b = got[f"{name}.block_scale"]
                self.assertEqual((dt, shape), (exp[f"{name}.block_scale"][0], list(sw.shape)), ctx)
                self.assertEqual(b, sw.tobytes(), ctx)
                self.assertEqual(got[f"{name}.qdata"][2], exp[f"{name}.qdata"][2], ctx)
                e = expected_dequant(fmt, r, scaling)
                ok, bad = f32_bits_equal(e.tobytes(), dq[name][2])
                self.assertTrue(ok, f"{ctx}: dequantize differs at {bad[:5]}")


class ErrorsTest(CliCase):
    def test_nonfinite_refused(self):
        for dt in ("f32", "bf16"):
            for fmt in ("nvfp4", "mxfp8", "fp8"):
                x = np.ones((4, 32), dtype=np.float32)
                x[0, 0] = np.nan
                x[1, 1] = np.inf
                x[2, 2] = -np.inf
                inp, outp = self.path("in.safetensors"), self.path("out.safetensors")
                save_file({"good": np.ones((2, 32), np.float32), "bad.tensor": as_dtype(x, dt)}, inp)
                p = run("quantize", inp, "-o", outp, "--format", fmt)
                with self.subTest(dt=dt, fmt=fmt):
                    self.assertEqual(p.returncode, 2, p.stderr)
                    self.assertIn("bad.tensor", p.stderr)
                    self.assertRegex(p.stderr, r"\b3\b", "stderr must give the non-finite count")
                    self.assertFalse(os.path.exists(outp))
                    self.assertEqual([f for f in os.listdir(self.tmp) if f != "in.safetensors"], [])

    def test_bad_shapes(self):
        inp, outp = self.path("in.safetensors"), self.path("out.safetensors")
        save_file({"odd.cols": np.ones((4, 24), np.float32)}, inp)
        p = run("quantize", inp, "-o", outp, "--format", "nvfp4")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("odd.cols", p.stderr)
        self.assertFalse(os.path.exists(outp))
        save_file({"odd.rows": np.ones((8, 32), np.float32)}, inp)
        p = run("quantize", inp, "-o", outp, "--format", "nvfp4", "--block2d")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("odd.rows", p.stderr)
        self.assertFalse(os.path.exists(outp))

    def test_truncated_and_unknown_format(self):
        inp, outp = self.path("in.safetensors"), self.path("out.safetensors")
        save_file({"w": np.ones((4, 32), np.float32)}, inp)
        with open(inp, "rb") as f:
            data = f.read()
        for cut in (4, 20, len(data) - 7):
            with open(self.path("trunc.safetensors"), "wb") as f:
                f.write(data[:cut])
            p = run("quantize", self.path("trunc.safetensors"), "-o", outp, "--format", "nvfp4")
            with self.subTest(cut=cut):
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertFalse(os.path.exists(outp))
        p = run("quantize", inp, "-o", outp, "--format", "nvfp5")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertFalse(os.path.exists(outp))

    def test_dequantize_bf16(self):
        seed = fresh_seed()
        x = heavy(np.random.default_rng(seed), (16, 64)).astype(BF16)
        inp, outp, dqp = self.path("in.safetensors"), self.path("out.safetensors"), self.path("dq.safetensors")
        save_file({"w": x}, inp)
        run("quantize", inp, "-o", outp, "--format", "nvfp4", "--scaling", "per_row", check=True)
        r = ref.nvfp4_quantize(ref.widen(x), "per_row")
        e = ref.nvfp4_dequantize(r["qdata"], r["block_scale"], r["amax"]).astype(BF16)   # assumed RNE to bf16
        for dtype in ("bf16", "source"):
            run("dequantize", outp, "-o", dqp, "--dtype", dtype, check=True)
            got, _ = read_st(dqp)
            self.assertEqual(got["w"][0:2], ("BF16", [16, 64]), f"seed {seed}")
            self.assertEqual(got["w"][2], e.tobytes(), f"seed {seed} --dtype {dtype}")


class SweepTest(CliCase):
    def check_rows(self, js):
        self.assertTrue(js["tensors"])
        for t in js["tensors"]:
            rows = t["results"]
            self.assertEqual(len(rows), 14, t["name"])
            names = sorted((r["format"], r["scale"]) for r in rows)
            fmts = ["E2M1", "E2M2", "E2M3", "E2M4", "E3M1", "E4M1", "E5M1"]
            self.assertEqual(names, sorted((f, s) for f in fmts for s in ("E4M3", "E8M0")))
            for r in rows:
                self.assertIsInstance(r["snr_db"], float, r)
                self.assertTrue(math.isfinite(r["snr_db"]), r)

    def test_generated(self):
        p = run("sweep", "--json", "--rows", "32", "--cols", "256", check=True)
        self.check_rows(json.loads(p.stdout))
        p = run("sweep", "--json", check=True)
        self.check_rows(json.loads(p.stdout))

    def test_file_matches_nvfp4(self):
        seed = fresh_seed()
        rng = np.random.default_rng(seed)
        x = heavy(rng, (32, 128))
        inp = self.path("in.safetensors")
        save_file({"w": x, "b": as_dtype(rng.standard_normal((8, 64)), "bf16"), "v": np.ones(4, np.float32)}, inp)
        for scaling in ("per_tensor", "per_row"):
            p = run("sweep", inp, "--json", "--scaling", scaling, check=True)
            js = json.loads(p.stdout)
            self.check_rows(js)
            self.assertEqual(sorted(t["name"] for t in js["tensors"]), ["b", "w"])
            # section 9: E2M1 with E4M3 scales reproduces section 2 exactly -> same SNR (float64 metrics)
            tw = [t for t in js["tensors"] if t["name"] == "w"][0]
            row = [r for r in tw["results"] if r["format"] == "E2M1" and r["scale"] == "E4M3"][0]
            r = ref.nvfp4_quantize(x, scaling)
            xh = ref.nvfp4_dequantize(r["qdata"], r["block_scale"], r["amax"]).astype(np.float64)
            x64 = x.astype(np.float64)
            snr = 20 * math.log10(np.linalg.norm(x64) / np.linalg.norm(xh - x64))
            self.assertAlmostEqual(row["snr_db"], snr, places=6, msg=f"seed {seed} {scaling}")
            self.assertAlmostEqual(row["mae"], float(np.mean(np.abs(xh - x64))), delta=1e-12 * max(1.0, row["mae"]))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_cli_quantize.py PATH_TO_lockstep [unittest args]")
    BIN = os.path.abspath(sys.argv.pop(1))
    ref.selftest(n=20000)
    print(f"lockstep binary {BIN}; base seed {BASE_SEED} (LOCKSTEP_TEST_SEED to replay)", flush=True)
    unittest.main(verbosity=2)
