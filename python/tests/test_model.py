"""Model and sampler handles from Python: a preset's weights equal `lockstep init`'s file, the
learner's log-probs equal the sampler's teacher-forced ones bit for bit in deterministic mode,
a sampled batch rescored by the learner gives a gap of exactly 0, the nn module handles equal
each other across calls, and rl_step moves the policy version through learner and sampler.

Usage: PYTHONPATH=BUILD/python python3 test_model.py PATH_TO_lockstep
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import lockstep
from lockstep import _lockstep
from lockstep._modules import GroupedLinearCall, LinearCall

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "py"))
from st_files import read_st  # noqa: E402

CLI = None
SEED = int(os.environ.get("LOCKSTEP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


class Model(unittest.TestCase):
    def test_init_matches_cli(self):
        m = lockstep.Model.init("tiny-dense", seed=3)
        self.assertIn("tiny-dense", lockstep.Model.presets())
        self.assertEqual(m.config["model_type"], "qwen3")
        with tempfile.TemporaryDirectory() as d:
            cli_dir, py_dir = os.path.join(d, "cli"), os.path.join(d, "py")
            subprocess.run([CLI, "init", "--preset", "tiny-dense", "--seed", "3", "-o", cli_dir],
                           check=True, capture_output=True, timeout=120)
            m.save(py_dir)
            want, _ = read_st(os.path.join(cli_dir, "model.safetensors"))
            got, _ = read_st(os.path.join(py_dir, "model.safetensors"))
            self.assertEqual(got, want)
            loaded = lockstep.Model.load(cli_dir)
            self.assertEqual(loaded.names(), m.names())
            for n in m.names():
                self.assertEqual(loaded.tensor(n).tobytes(), m.tensor(n).tobytes(), n)

    def test_learner_equals_sampler_deterministic(self):
        m = lockstep.Model.init("tiny-moe", seed=1)
        for recipe in ("bf16", "nvfp4_per_token"):
            learner = lockstep.Learner(m, recipe, deterministic=True)
            sampler = lockstep.Sampler(max_new=6, seed=SEED % 1000)
            sampler.load(learner.export_policy(), 0, recipe)
            prompts = [[1, 5, 9], [2, 3], [7, 7, 7, 7]]
            outs = sampler.generate(prompts)
            seqs = [p + o["tokens"] for p, o in zip(prompts, outs)]
            scores = learner.sequence_logprobs(seqs)
            for p, o, s in zip(prompts, outs, scores):
                got = s[len(p) - 1:]
                self.assertEqual(np.asarray(o["logprobs"], np.float32).tobytes(), got.tobytes(),
                                 f"{recipe} [seed {SEED}]")
                self.assertEqual(sampler.score(p, o["tokens"]), o["logprobs"])

    def test_rl_step(self):
        m = lockstep.Model.init("tiny-moe", seed=2)
        learner = lockstep.Learner(m, "nvfp4_per_token", deterministic=True, lr=1e-3)
        sampler = lockstep.Sampler(max_new=4, seed=5)
        sampler.load(learner.export_policy(), 0, "nvfp4_per_token")
        target = 11

        def reward(prompt, tokens):
            return 1.0 if target in tokens else 0.0

        stats = lockstep.rl_step(learner, sampler, [[1, 2, 3], [4, 5]], reward, group=4)
        self.assertEqual(stats["version"], 1)
        self.assertEqual(learner.version, 1)
        self.assertEqual(sampler.version, 1)
        self.assertEqual(stats["mismatch"]["max_abs_gap"], 0.0)  # deterministic: exactly 0
        self.assertFalse(stats["skipped"])
        with self.assertRaises(RuntimeError):  # a version the sampler did not expect
            sampler.load(learner.export_policy(), 7, "nvfp4_per_token")

    def test_refusals(self):
        with self.assertRaises(lockstep.Error):
            lockstep.Model.init("tiny-giant")
        with self.assertRaises(lockstep.Error):
            lockstep.Model.init()
        m = lockstep.Model.init("tiny-dense")
        learner = lockstep.Learner(m, "bf16")
        with self.assertRaises(lockstep.Error) as cm:
            learner.forward(np.array([1, 2], np.float32), [0, 2], np.array([2, 3], np.int32))
        self.assertIn("tokens", str(cm.exception))


class LinearHandles(unittest.TestCase):
    """The handle lockstep.torch runs: two calls over the same inputs give the same bytes, and the
    backward of each mode fills dx and the weight gradient."""

    def test_linear_each_backward_mode(self):
        rng = np.random.default_rng(SEED)
        x = rng.standard_normal((24, 64)).astype(np.float32)
        w = rng.standard_normal((48, 64)).astype(np.float32)
        dy = rng.standard_normal((24, 48)).astype(np.float32)
        for name in ("bf16", "nvfp4_per_token", "nvfp4_per_token_bf16_bwd",
                     "nvfp4_per_token_dequant_bwd", "mxfp8", "fp8_block"):
            r = lockstep.Recipe.from_name(name)
            outs = []
            for _ in range(2):
                g = np.zeros_like(w)
                call = LinearCall("l", w, g, r, grad_seed=9)
                y = np.from_dlpack(call.forward(x, True)).copy()
                dx = np.from_dlpack(call.backward(dy)).copy()
                outs.append((y.tobytes(), dx.tobytes(), g.tobytes()))
                self.assertTrue(np.any(g != 0), name)
            self.assertEqual(outs[0], outs[1], name)
            # the forward equals qgemm of the operands the recipe names (fprop: activation x weight)
            spec = r.module_spec()["fprop"]
            if spec["activation"]["format"] == "nvfp4":
                qa = lockstep.quantize(x, "nvfp4", spec["activation"]["scaling"])
                qw = lockstep.quantize(w, "nvfp4", spec["weight"]["scaling"],
                                       block2d=spec["weight"].get("block2d", False))
                self.assertEqual(lockstep.qgemm(qa, qw).d.tobytes(), outs[0][0], name)

    def test_grouped_any_split_equals_padded_groups(self):
        """Group sizes that are not multiples of the wgrad GEMM's row multiple (32) train: the
        handle pads each group with zero rows, so y, dx and dW equal a call whose caller padded
        the groups itself."""
        rng = np.random.default_rng(SEED)
        splits, padded = [16, 0, 24], [32, 0, 32]
        x = rng.standard_normal((40, 64)).astype(np.float32)
        dy = rng.standard_normal((40, 32)).astype(np.float32)
        w = rng.standard_normal((3 * 32, 64)).astype(np.float32)
        xp, dyp = np.zeros((64, 64), np.float32), np.zeros((64, 32), np.float32)
        xp[:16], xp[32:56] = x[:16], x[16:]
        dyp[:16], dyp[32:56] = dy[:16], dy[16:]
        for name in ("bf16", "nvfp4_per_token", "mxfp8", "fp8_block"):
            r = lockstep.Recipe.from_name(name)
            g, gp = np.zeros_like(w), np.zeros_like(w)
            call = GroupedLinearCall("e", w, g, 3, r, grad_seed=4)
            y = np.from_dlpack(call.forward(x, splits, True)).copy()
            dx = np.from_dlpack(call.backward(dy)).copy()
            ref = GroupedLinearCall("e", w, gp, 3, r, grad_seed=4)
            yp = np.from_dlpack(ref.forward(xp, padded, True)).copy()
            dxp = np.from_dlpack(ref.backward(dyp)).copy()
            rows = np.r_[0:16, 32:56]
            self.assertEqual(y.tobytes(), yp[rows].tobytes(), name)
            self.assertEqual(dx.tobytes(), dxp[rows].tobytes(), name)
            self.assertEqual(g.tobytes(), gp.tobytes(), name)
            self.assertTrue(np.any(g != 0), name)
            with self.assertRaises(lockstep.Error):
                call.backward(dy[:39])

    def test_inference_handle_and_errors(self):
        r = lockstep.Recipe.from_name("nvfp4_per_token")
        w = np.ones((16, 32), np.float32)
        inf = _lockstep.Linear.inference("l", w, r.handle)
        y = np.from_dlpack(inf.forward(np.ones((3, 32), np.float32), False))
        self.assertEqual(y.shape, (3, 16))
        self.assertIsInstance(inf.fprop_weight(), _lockstep.QTensor)
        with self.assertRaises(lockstep.Error):
            LinearCall("l", w.astype(np.float16), None, r)
        call = LinearCall("l", w, None, r)
        with self.assertRaises(lockstep.Error) as cm:
            call.forward(np.ones((3, 31), np.float32), False)
        self.assertIn("l", str(cm.exception))


if __name__ == "__main__":
    CLI = os.path.abspath(sys.argv.pop(1))
    print(f"LOCKSTEP_TEST_SEED={SEED}", flush=True)
    unittest.main(verbosity=1)
