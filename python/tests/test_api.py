"""lockstep's Python API beyond quantize, on NumPy arrays: qgemm against `lockstep gemm` byte for
byte and against exact integer products, grouped_qgemm against per-group qgemm, recipes against
`lockstep recipes / describe`, the RL numerics (align_stats, TIS, TRIAGE, GRPO, the objective)
against values computed by hand from docs/rl.md, and their refusals.

Usage: PYTHONPATH=BUILD/python python3 test_api.py PATH_TO_lockstep
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from safetensors.numpy import save_file as st_save

import lockstep

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "py"))
from st_files import read_st  # noqa: E402

CLI = None
SEED = int(os.environ.get("LOCKSTEP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def cli(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("LOCKSTEP_RECIPE", "DISABLE_BACKWARD_QUANT")}
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300, env=env)
    if p.returncode != 0:
        raise AssertionError(f"lockstep {' '.join(map(str, args))}: rc {p.returncode}\n{p.stderr}")
    return p


class Gemm(unittest.TestCase):
    def test_qgemm_matches_cli(self):
        rng = np.random.default_rng(SEED)
        a = rng.standard_normal((37, 128)).astype(np.float32)
        w = rng.standard_normal((24, 128)).astype(np.float32)
        with tempfile.TemporaryDirectory() as d:
            pa, pw, pd = (os.path.join(d, n) for n in ("a.safetensors", "w.safetensors", "d.safetensors"))
            st_save({"a": a}, pa)
            st_save({"w": w}, pw)
            for fmt, scaling in (("nvfp4", "per_row"), ("mxfp8", None), ("fp8", "block_1x128")):
                args = ["gemm", "--a", pa, "--w", pw, "-o", pd, "--format", fmt]
                if scaling:
                    args += ["--scaling", scaling]
                cli(*args)
                want = read_st(pd)[0]["d"][2]
                qa = lockstep.quantize(a, fmt, scaling)
                qw = lockstep.quantize(w, fmt, scaling)
                r = lockstep.qgemm(qa, qw)
                self.assertEqual(r.d.shape, (37, 24))
                self.assertEqual(r.d.tobytes(), want, f"[seed {SEED}] {fmt} {scaling}")
                self.assertEqual(r.kernel, "cpu")

    def test_dense_bf16_exact_and_epilogue(self):
        rng = np.random.default_rng(SEED + 1)
        a = rng.integers(-8, 9, (5, 32)).astype(np.float32)
        w = rng.integers(-8, 9, (6, 32)).astype(np.float32)
        import ml_dtypes

        r = lockstep.qgemm(a.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16))
        np.testing.assert_array_equal(r.d, a @ w.T)  # small integers: every product and sum exact
        bias = np.arange(6, dtype=np.float32)
        cfg = lockstep.GemmConfig(alpha=2.0, bias=bias, row_amax=True)
        r2 = lockstep.qgemm(a, w, cfg)
        want = 2.0 * (a @ w.T) + bias
        np.testing.assert_array_equal(r2.d, want)
        np.testing.assert_array_equal(r2.row_amax, np.abs(want).max(axis=1))
        r3 = lockstep.qgemm(a, w, lockstep.GemmConfig(out_dtype="bf16"))
        self.assertEqual(r3.d.dtype, ml_dtypes.bfloat16)  # NumPy gets bf16 as ml_dtypes
        # the exact fp32 result rounded once to bf16 (nearest even)
        self.assertEqual(r3.d.tobytes(), (a @ w.T).astype(ml_dtypes.bfloat16).tobytes())

    def test_grouped_equals_per_group(self):
        rng = np.random.default_rng(SEED + 2)
        offs = np.array([0, 16, 16, 48], dtype=np.int64)
        a = rng.standard_normal((48, 64)).astype(np.float32)
        w = rng.standard_normal((3 * 8, 64)).astype(np.float32)
        qa = lockstep.quantize(a, "nvfp4", "per_row")
        qw = lockstep.quantize(w, "nvfp4", "per_group", offsets=[0, 8, 16, 24])
        r = lockstep.grouped_qgemm(qa, offs, qw)
        self.assertEqual(r.d.shape, (48, 8))
        for g in range(3):
            a0, a1 = offs[g], offs[g + 1]
            if a1 == a0:
                continue
            wg = lockstep.quantize(w[8 * g:8 * (g + 1)], "nvfp4", "per_tensor")
            ag = lockstep.quantize(a[a0:a1], "nvfp4", "per_row")
            self.assertEqual(lockstep.qgemm(ag, wg).d.tobytes(), r.d[a0:a1].tobytes(), f"group {g}")

    def test_refusals(self):
        a = np.ones((4, 32), np.float32)
        with self.assertRaises(lockstep.Error) as cm:
            lockstep.qgemm(a, np.ones((4, 16), np.float32))
        self.assertIn("32", str(cm.exception))
        with self.assertRaises(lockstep.Error):
            lockstep.qgemm(a, a, lockstep.GemmConfig(order="slow"))
        with self.assertRaises(lockstep.Error):
            lockstep.qgemm(a, a, lockstep.GemmConfig(kernel="warp9"))


class Recipes(unittest.TestCase):
    def test_registry_and_describe_match_cli(self):
        want = json.loads(cli("recipes", "--json").stdout)
        self.assertEqual(lockstep.recipes(), want)
        for name in ("nvfp4_per_token", "fp8_block", "bf16"):
            r = lockstep.Recipe.from_name(name)
            self.assertEqual(r.name, name)
            self.assertEqual(r.describe(20), json.loads(cli("describe", name, "--layers", "20", "--json").stdout))
            self.assertEqual(r.to_dict(), next(x["recipe"] for x in want if x["name"] == name))

    def test_file_dict_and_selection(self):
        base = lockstep.Recipe.from_name("nvfp4_per_token")
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "mine.json")
            with open(p, "w") as f:
                json.dump({"extends": "nvfp4_per_token", "backward_mode": "high_precision"}, f)
            r = lockstep.Recipe.from_file(p)
            self.assertEqual(r.name, "mine")
            self.assertEqual(r.to_dict()["backward_mode"], "high_precision")
            self.assertEqual(lockstep.Recipe.from_dict(base.to_dict(), "x"), base)
        old = os.environ.get("LOCKSTEP_RECIPE")
        os.environ["LOCKSTEP_RECIPE"] = "mxfp8"
        try:
            sel = lockstep.Recipe.select()
            self.assertEqual(sel.name, "mxfp8")
            self.assertEqual(sel.provenance["source"], "env")
            self.assertEqual(lockstep.Recipe.select("fp8_block").name, "fp8_block")
        finally:
            if old is None:
                del os.environ["LOCKSTEP_RECIPE"]
            else:
                os.environ["LOCKSTEP_RECIPE"] = old
        with self.assertRaises(lockstep.RecipeError) as cm:
            lockstep.Recipe.from_name("nvfp4_per_tok")
        self.assertIn("nvfp4_per_token", str(cm.exception))

    def test_module_spec(self):
        r = lockstep.Recipe.from_name("nvfp4_per_token")
        self.assertEqual(r.module_spec()["fprop"]["activation"]["format"], "nvfp4")
        # Coverage: the last layers of nvfp4_per_token keep their experts in bf16.
        d = r.describe(48)
        last = d["layers"][47]["modules"]["experts_fc1"]["fprop"]
        spec = r.module_spec("experts_fc1", layer=47, layers=48)
        self.assertEqual(last, "bf16")
        self.assertEqual(spec["fprop"]["activation"]["format"], "bf16")


class Rl(unittest.TestCase):
    def test_align_stats_by_hand(self):
        learner = np.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]], np.float32)
        sampler = np.array([[-1.5, -2.0, -0.25], [-1.0, -8.0, -3.0]], np.float32)
        mask = np.array([[1, 1, 1], [1, 1, 0]], np.uint8)
        adv = np.array([1.0, -2.0], np.float32)
        s = lockstep.align_stats(learner, sampler, adv, mask)
        delta = np.array([0.5, 0.0, -0.25, 0.0, 7.0])
        self.assertEqual(s["gap_tokens"], 5)
        self.assertAlmostEqual(s["mean_gap"], delta.mean(), places=12)
        self.assertAlmostEqual(s["mean_abs_gap"], np.abs(delta).mean(), places=12)
        self.assertEqual(s["max_abs_gap"], 7.0)
        self.assertEqual(s["q05_gap"], -0.25)
        # |A| shares: A>0 & delta>0: 1 token (0.5) weight 1; A>0 & delta<0: 1; A<0 & delta>0: 2.
        total = 3 * 1.0 + 2 * 2.0
        self.assertAlmostEqual(s["gap_share_pos_adv_pos"], 1.0 / total)
        self.assertAlmostEqual(s["gap_share_pos_adv_neg"], 1.0 / total)
        self.assertAlmostEqual(s["gap_share_neg_adv_pos"], 2.0 / total)
        self.assertEqual(s["gap_share_neg_adv_neg"], 0.0)
        packed = lockstep.align_stats(learner.reshape(-1)[:5], sampler.reshape(-1)[:5], adv,
                                      np.ones(5, np.uint8), offsets=np.array([0, 3, 5]))
        self.assertEqual(packed, s)

    def test_tis_and_triage_by_hand(self):
        old = np.array([-1.0, -1.0, -1.0, -1.0], np.float32)
        samp = np.array([-1.0, -2.0, 0.0, -1.5], np.float32)
        mask = np.array([1, 1, 1, 0], np.uint8)
        w, st = lockstep.tis_weights(old, samp, mask, cap=2.0, return_stats=True)
        want = np.array([1.0, 2.0, math.exp(-1.0), 0.0], np.float32)  # exp(1) clipped to 2
        np.testing.assert_allclose(w, want, rtol=0, atol=1e-7)
        self.assertAlmostEqual(st["clip_frac"], 1 / 3)
        # TRIAGE: one negative-advantage response, one segment with mean delta -2 -> weight 0.1
        # on its tokens with delta < 0; a positive response keeps 1.
        old = np.zeros((2, 4), np.float32)
        samp = np.array([[2.0, 2.0, 2.0, 2.0], [2.0, 2.0, 2.0, 2.0]], np.float32)
        mask = np.ones((2, 4), np.uint8)
        adv = np.array([-1.0, 1.0], np.float32)
        g = lockstep.triage_weights(old, samp, adv, mask)
        self.assertEqual(g.shape, (2, 4))
        np.testing.assert_array_equal(g[0], np.full(4, 0.1, np.float32))
        np.testing.assert_array_equal(g[1], np.ones(4, np.float32))

    def test_grpo_and_objective(self):
        r = np.array([1, 0, 0, 1, 1, 1], np.float32)
        a = lockstep.grpo_advantages(r, 3)
        m, s = 1 / 3, math.sqrt(2 / 9)
        np.testing.assert_allclose(a[:3], [(1 - m) / (s + 1e-6), -m / (s + 1e-6), -m / (s + 1e-6)], rtol=1e-6)
        np.testing.assert_array_equal(a[3:], [0, 0, 0])
        lp = np.array([[-1.0, -2.0], [-0.5, -0.5]], np.float32)
        loss, grad, st = lockstep.objective(lp, lp, np.array([1.0, -1.0], np.float32),
                                            np.ones((2, 2), np.uint8))
        # ratio 1 everywhere: loss = mean over responses of -A (token means) = 0; dL/dlogp = -A / (2 * 2)
        self.assertEqual(loss, 0.0)
        np.testing.assert_array_equal(grad, np.array([[-0.25, -0.25], [0.25, 0.25]], np.float32))
        self.assertEqual(st["tokens"], 4)

    def test_refusals(self):
        with self.assertRaises(lockstep.Error) as cm:
            lockstep.tis_weights(np.zeros(3, np.float32), np.zeros(4, np.float32), np.ones(3, np.uint8))
        self.assertIn("logp_sampler", str(cm.exception))
        with self.assertRaises(lockstep.Error) as cm:
            lockstep.align_stats(np.zeros(3, np.float32), np.zeros(3, np.float32),
                                 np.zeros(1, np.float32), np.array([1, 2, 1], np.uint8),
                                 offsets=np.array([0, 3]))
        self.assertIn("mask", str(cm.exception))
        with self.assertRaises(lockstep.Error):
            lockstep.align_stats(np.zeros(3, np.float32), np.zeros(3, np.float32),
                                 np.zeros(1, np.float32), np.ones(3, np.uint8))  # no offsets


class Module(unittest.TestCase):
    @unittest.skipUnless(sys.platform.startswith("linux") and shutil.which("nm"),
                         "needs Linux and binutils' nm")
    def test_exports_only_its_init(self):
        # The archives linked into the extension (lockstep, nanobind, a static libstdc++) must not
        # export symbols: a static libstdc++'s unique symbols would bind process-wide and break
        # another extension loaded later with the shared libstdc++ (torch).
        from lockstep import _lockstep
        out = subprocess.run(["nm", "-D", "--defined-only", _lockstep.__file__], capture_output=True,
                             text=True, check=True).stdout
        names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
        self.assertEqual(names, ["PyInit__lockstep"], f"{len(names)} exported: {names[:20]}")


if __name__ == "__main__":
    CLI = os.path.abspath(sys.argv.pop(1))
    print(f"LOCKSTEP_TEST_SEED={SEED}", flush=True)
    unittest.main(verbosity=1)
