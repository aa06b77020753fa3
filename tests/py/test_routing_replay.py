"""End-to-end checks of routing replay (`--routing-replay`) on a micro Qwen3-MoE model: `train`
writes the gap with replay (the mismatch keys, what the objective sees) and without it
(no_replay_*) in metrics.jsonl and labels the run; under --deterministic with one recipe the gap
with replay is exactly 0; `align --routing-replay --json` reports both gaps; and on a dense model
train, compare and align refuse the flag (exit 2, a message naming the problem, nothing written).

Run: python3 tests/py/test_routing_replay.py PATH_TO_lockstep_BINARY
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_routing_replay.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import load_json, init_micro_model, rows, run_lockstep  # noqa: E402

RUN = ["--steps", "2", "--prompts", "4", "--group", "4", "--max-new", "4", "--eval-prompts", "4",
       "--eval-every", "2", "--checkpoint-every", "2", "--format-bonus", "0.5", "--lr", "0.01",
       "--difficulty", "1"]
GAP_KEYS = ("no_replay_mean_gap", "no_replay_mean_abs_gap", "no_replay_max_abs_gap",
            "no_replay_q05_gap")


def run(*args, **kw):
    return run_lockstep(LOCKSTEP, *args, **kw)


class RoutingReplay(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lockstep-replay-")
        cls.model = os.path.join(cls.tmp, "micro")
        init_micro_model(LOCKSTEP, cls.model)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def test_train_reports_the_gap_with_and_without_replay(self):
        d = self.path("mismatched")
        # Two minibatches: each one's replay is packed from its own samples.
        run("train", "--model", self.model, "--out", d, *RUN, "--recipe", "bf16",
            "--sampler-recipe", "nvfp4_per_token", "--routing-replay", "--minibatches", "2")
        meta = load_json(os.path.join(d, "run_meta.json"))
        self.assertTrue(meta["options"]["routing_replay"])
        rs = rows(d)
        self.assertEqual([r["step"] for r in rs], [0, 1, 2])
        for r in rs[1:]:
            for k in GAP_KEYS + ("mean_abs_gap", "max_abs_gap"):
                self.assertIsInstance(r[k], float, k)
            self.assertGreater(r["no_replay_mean_abs_gap"], 0)
            print(f"[ measured ] step {r['step']}: mean |gap| {r['mean_abs_gap']:.3e} with "
                  f"replay, {r['no_replay_mean_abs_gap']:.3e} without")
        with open(os.path.join(d, "report.html")) as f:
            self.assertIn("routing replay", f.read())

    def test_deterministic_gap_with_replay_is_exactly_zero(self):
        d = self.path("det")
        run("train", "--model", self.model, "--out", d, *RUN, "--recipe", "nvfp4_per_token",
            "--deterministic", "--routing-replay")
        for r in rows(d)[1:]:
            self.assertEqual(r["max_abs_gap"], 0.0)
            self.assertEqual(r["no_replay_max_abs_gap"], 0.0)

    def test_without_replay_the_no_replay_keys_are_null(self):
        d = self.path("plain")
        run("train", "--model", self.model, "--out", d, *RUN, "--recipe", "bf16")
        for r in rows(d)[1:]:
            for k in GAP_KEYS:
                self.assertIsNone(r[k], k)

    def test_align_reports_both_gaps(self):
        j = json.loads(run("align", "--model", self.model, "--recipe", "bf16", "--sampler-recipe",
                           "nvfp4_per_token", "--routing-replay", "--batch", "4", "--max-new",
                           "4", "--json").stdout)
        self.assertTrue(j["routing_replay"])
        for k in ("mean_abs_gap", "no_replay_mean_abs_gap", "no_replay_max_abs_gap",
                  "no_replay_q05_gap", "routing_mismatch"):
            self.assertIsInstance(j[k], (int, float), k)
        j = json.loads(run("align", "--model", self.model, "--recipe", "nvfp4_per_token",
                           "--deterministic", "--routing-replay", "--json").stdout)
        self.assertEqual(j["max_abs_gap"], 0)
        self.assertEqual(j["routing_mismatch"], 0)
        j = json.loads(run("align", "--model", self.model, "--json").stdout)
        self.assertFalse(j["routing_replay"])
        self.assertIsNone(j["no_replay_mean_abs_gap"])

    def test_a_dense_model_is_refused(self):
        out = self.path("never")
        for cmd in (["train", "--preset", "tiny-dense", "--out", out],
                    ["compare", "--preset", "tiny-dense", "--out", out],
                    ["train", "--preset", "tiny-dense", "--out", out, "--dry-run"],
                    ["align", "--preset", "tiny-dense"]):
            r = run(*cmd, "--routing-replay", check=False)
            self.assertEqual(r.returncode, 2, f"{cmd}: {r.stderr}")
            self.assertIn("lockstep: error: --routing-replay: routing replay needs a MoE model",
                          r.stderr, cmd)
            self.assertIn("has no MoE layer", r.stderr, cmd)
            self.assertFalse(os.path.exists(out), cmd)


if __name__ == "__main__":
    unittest.main()
