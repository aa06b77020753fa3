"""End-to-end checks of the mismatch lab on a micro Qwen3-MoE model (two layers, hidden 32) after a
short warm start: a bf16 learner behind an FP8 sampler (`--sampler-recipe`) has a gap that TIS
truncates and the TRIAGE gate and repair act on (counts > 0), while under `--deterministic` with
one shared contract none of them acts; both runs are labelled with both recipes; the policy
version advances by one per RL step with any number of minibatches; a run with a sampler recipe
resumes bit for bit; `compare` gives mean and spread over seeds; `align --sampler-recipe`; the
long-answer task; and every refusal (exit 2, a message naming the problem, nothing written).

The micro model's gaps are ~1e-3 nats, far below TRIAGE's thresholds (-0.5 / -1.5 / -6 nats,
set for billion-parameter models), so the runs that must act scale the thresholds to this gap
with the options that hold them; the deterministic run uses the same thresholds.

Run: python3 tests/py/test_mismatch_lab.py PATH_TO_lockstep_BINARY
"""
import json
import os
import shutil
import signal
import sys
import tempfile
import unittest

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_mismatch_lab.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import (kill_after_checkpoint, load_json, init_micro_model, rows,  # noqa: E402
                        run_lockstep, untimed)

RUN = ["--steps", "4", "--prompts", "8", "--group", "8", "--max-new", "4", "--eval-prompts", "8",
       "--eval-every", "2", "--checkpoint-every", "2", "--format-bonus", "0.5", "--lr", "0.01",
       "--difficulty", "1"]
# TIS, gate and repair thresholds at the micro model's gap (~1e-3 nats).
SCALED = ["--tis-cap", "1.002", "--gate-mild-gap", "-0.001", "--gate-severe-gap", "-0.004",
          "--gate-tail-gap", "-0.006", "--repair-margin", "-0.001"]


def run(*args, **kw):
    return run_lockstep(LOCKSTEP, *args, **kw)


def total(rs, key):
    return sum(r[key] for r in rs[1:] if r.get(key) is not None)




class MismatchLab(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lockstep-mlab-")
        init = os.path.join(cls.tmp, "init")
        init_micro_model(LOCKSTEP, init)
        # A short warm start of a fixed 60 steps at a constant lr (no warmup, no target): the
        # policy writes digits and <eos>, so rewards vary and both negative- and
        # positive-advantage responses occur.
        cls.model = os.path.join(cls.tmp, "warm")
        run("pretrain", "--model", init, "--steps", "60", "--batch", "16", "--lr", "0.02",
            "--warmup", "0", "--target", "0",
            "--difficulty", "1", "--max-new", "4", "--eval-prompts", "8", "-o", cls.model)
        cls.mismatched = os.path.join(cls.tmp, "mismatched")
        cls.mismatched_out = run("train", "--model", cls.model, "--out", cls.mismatched, *RUN,
                                 "--recipe", "bf16", "--sampler-recipe", "fp8_per_tensor",
                                 "--guard", "triage", *SCALED)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def test_guards_act_on_a_mismatched_pairing(self):
        rs = rows(self.mismatched)
        self.assertGreater(total(rs, "tis_clipped_tokens"), 0)
        self.assertGreater(total(rs, "triage_gated_segments"), 0)
        self.assertGreater(total(rs, "triage_gated_tokens"), 0)
        self.assertGreater(total(rs, "triage_repair_active_segments"), 0)
        self.assertTrue(all(r["mean_abs_gap"] > 0 for r in rs[1:]))
        for r in rs:
            self.assertEqual(r["policy_version"], r["step"])
        # The first and last evaluations also read the policy through bf16.
        self.assertIn("eval_accuracy_bf16", rs[0])
        self.assertIn("eval_accuracy_bf16", rs[-1])
        self.assertIn("read through bf16: start", self.mismatched_out.stdout)
        results = load_json(os.path.join(self.mismatched, "run_meta.json"))["results"]
        self.assertEqual(results["start_eval_accuracy_bf16"], rs[0]["eval_accuracy_bf16"])
        self.assertEqual(results["policy_version"], 4)
        self.assertEqual(len(rs[1]["gap_hist"]), 21)
        self.assertEqual(sum(rs[1]["gap_hist"]), rs[1]["gap_tokens"])
        # Both recipes label the run.
        meta = load_json(os.path.join(self.mismatched, "run_meta.json"))
        self.assertEqual(meta["recipe"]["name"], "bf16")
        self.assertEqual(meta["sampler_recipe"]["name"], "fp8_per_tensor")
        self.assertFalse(meta["sampler_recipe"]["shared_contract"])
        self.assertEqual(meta["options"]["sampler_recipe"]["name"], "fp8_per_tensor")
        with open(os.path.join(self.mismatched, "report.html")) as f:
            html = f.read()
        self.assertIn("learner bf16, sampler fp8_per_tensor", html)
        self.assertIn("TRIAGE gate", html)
        self.assertIn('class="histogram"', html)

    def test_nothing_acts_under_deterministic_with_one_contract(self):
        d = self.path("det")
        run("train", "--model", self.model, "--out", d, *RUN, "--recipe", "nvfp4_per_token",
            "--deterministic", "--guard", "triage", *SCALED)
        rs = rows(d)
        for r in rs[1:]:
            self.assertEqual(r["mean_abs_gap"], 0.0)
            self.assertEqual(r["max_abs_gap"], 0.0)
            self.assertEqual(r["tis_clipped_tokens"], 0)
            self.assertEqual(r["tis_weight_mean"], 1.0)
            self.assertEqual(r["triage_gated_tokens"], 0)
            self.assertEqual(r["triage_gated_segments"], 0)
            self.assertEqual(r["triage_repair_active_segments"], 0)
            self.assertGreater(r["triage_gate_segments"] + r["triage_repair_segments"], 0)
            hist = r["gap_hist"]
            self.assertEqual(hist[10], sum(hist))  # every delta exactly 0
        meta = load_json(os.path.join(d, "run_meta.json"))
        self.assertTrue(meta["sampler_recipe"]["shared_contract"])

    def test_fp8_cache_with_a_matching_learner_has_no_gap(self):
        # With an FP8 sampler cache and --deterministic, the learner that rounds K / V like the
        # cache scores exactly what the sampler scored; the learner that reads bf16 K / V does not.
        runs = {}
        for learner_kv in ("match", "bf16"):
            d = self.path("kv-" + learner_kv)
            run("train", "--model", self.model, "--out", d, *RUN,
                "--recipe", "nvfp4_per_token", "--deterministic", "--kv-cache", "fp8",
                "--learner-kv", learner_kv)
            runs[learner_kv] = rows(d)[1:]
            meta = load_json(os.path.join(d, "run_meta.json"))
            self.assertEqual(meta["options"]["learner_kv"], learner_kv)
            self.assertEqual(meta["sampler_recipe"]["kv_cache"], "fp8")
            self.assertEqual(meta["sampler_recipe"]["learner_kv"],
                             "fp8" if learner_kv == "match" else "bf16")
        for r in runs["match"]:
            self.assertEqual(r["max_abs_gap"], 0.0)
        self.assertGreater(runs["bf16"][0]["mean_abs_gap"], 0.0)
        for learner_kv, want_zero in (("match", True), ("bf16", False)):
            j = json.loads(run("align", "--model", self.model, "--recipe", "nvfp4_per_token",
                               "--deterministic", "--kv-cache", "fp8", "--learner-kv",
                               learner_kv, "--batch", "4", "--max-new", "4", "--json").stdout)
            self.assertEqual(j["learner_kv"], learner_kv)
            self.assertEqual(j["max_abs_gap"] == 0.0, want_zero, j)

    def test_minibatches_one_version_per_step_and_resume(self):
        d = self.path("mb")
        args = ["train", "--model", self.model, "--out", d, *RUN[:1], "12", *RUN[2:],
                "--minibatches", "2", "--recipe", "bf16", "--sampler-recipe", "nvfp4_per_token",
                "--guard", "triage", *SCALED]
        rc = kill_after_checkpoint([LOCKSTEP, *args], d, 2)
        self.assertEqual(rc, -signal.SIGKILL, "the run ended before it was killed")
        state = os.path.join(d, "checkpoint", "trainer.json")
        run("train", "--resume", d)
        full = self.path("mb-full")
        run(*[full if x == d else x for x in args])
        rs = rows(d)
        self.assertEqual(untimed(rs), untimed(rows(full)))
        for r in rs[1:]:
            self.assertEqual(r["policy_version"], r["step"])
            self.assertEqual(r["optimizer_steps"], 2 * r["step"])
        self.assertEqual(load_json(state)["policy_version"], 12)
        self.assertEqual(load_json(os.path.join(d, "run_meta.json"))["results"]["policy_version"],
                         12)

    def test_long_answers_count_truncation(self):
        long_model = self.path("ctx128")
        init_micro_model(LOCKSTEP, long_model, max_position_embeddings=128)
        d = self.path("cumsum")
        run("train", "--model", long_model, "--out", d, "--task", "cumsum", "--difficulty", "11",
            "--max-new", "66", "--reward", "prefix", "--steps", "1", "--prompts", "2", "--group",
            "2", "--eval-prompts", "2", "--guard", "triage")
        rs = rows(d)
        # An untrained policy rarely stops: responses that reach --max-new are counted, wrong.
        self.assertGreaterEqual(rs[1]["truncated_frac"], 0.0)
        self.assertIn("eval_truncated", rs[0])
        if rs[1]["truncated_frac"] == 1.0:
            self.assertEqual(rs[1]["reward_mean"], 0.0)
        # A response that reached the 66-token limit spans two 64-token segments.
        truncated = round(rs[1]["truncated_frac"] * 4)
        self.assertGreaterEqual(rs[1]["gap_segments"], 4 + truncated)
        meta = load_json(os.path.join(d, "run_meta.json"))
        self.assertEqual(meta["task"]["eval_prompts_seen_in_training"], 0)

    def test_compare_gives_mean_and_spread_over_seeds(self):
        out = self.path("cmp")
        r = run("compare", "--model", self.model, "--recipes", "bf16", "--sampler-recipes",
                "bf16,fp8_per_tensor", "--guards", "none,triage", "--seeds", "0,1", "--out", out,
                *RUN[:1], "1", *RUN[2:], "--json")
        summary = load_json(os.path.join(out, "summary.json"))
        self.assertEqual(len(summary["runs"]), 8)
        groups = summary["groups"]
        self.assertEqual([(g["sampler_recipe"], g["guard"]) for g in groups],
                         [(None, "none"), (None, "triage"), ("fp8_per_tensor", "none"),
                          ("fp8_per_tensor", "triage")])
        for g in groups:
            self.assertEqual(g["seeds"], [0, 1])
            self.assertEqual(g["final_eval_accuracy"]["n"], 2)
            self.assertIn("sd", g["mean_abs_delta"])
        self.assertEqual(groups[0]["mean_abs_delta"]["mean"] < groups[2]["mean_abs_delta"]["mean"],
                         True)
        with open(os.path.join(out, "summary.md")) as f:
            md = f.read()
        self.assertIn("±", md)
        self.assertIn("| bf16 | fp8_per_tensor | triage |", md)
        self.assertIn("sampler KV cache bf16, learner K / V bf16", md)
        self.assertIn("seed1", json.loads(r.stdout)["runs"][-1]["run"])
        r = run("compare", "--model", self.model, "--seeds", "1,1", "--out", self.path("cmp2"),
                check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--seeds lists 1 twice", r.stderr)
        self.assertFalse(os.path.exists(self.path("cmp2")))

    def test_align_with_a_sampler_recipe(self):
        r = run("align", "--model", self.model, "--recipe", "bf16", "--sampler-recipe",
                "nvfp4_per_token", "--batch", "4", "--max-new", "4", "--json")
        j = json.loads(r.stdout)
        self.assertEqual(j["learner_recipe"], "bf16")
        self.assertEqual(j["sampler_recipe"], "nvfp4_per_token")
        self.assertGreater(j["mean_abs_gap"], 0)
        r = run("align", "--model", self.model, "--recipe", "bf16", "--sampler-recipe",
                "nvfp4_per_token", "--learner-recipe", "mxfp8", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not both", r.stderr)

    def test_refusals_exit_2_and_write_nothing(self):
        out = self.path("never")
        bad_recipe = self.path("fp6.json")
        with open(bad_recipe, "w") as f:
            json.dump({"name": "fp6", "extends": "bf16",
                       "fprop": {"activation": {"format": "fp6"}}}, f)
        for extra, needle in ((["--sampler-recipe", "nvfp5"], "--sampler-recipe nvfp5"),
                              (["--sampler-recipe", bad_recipe], "fp6"),
                              (["--kv-cache", "int4"], "--kv-cache 'int4'"),
                              (["--learner-kv", "fp8"], "--learner-kv 'fp8'"),
                              (["--guard", "tis+triage"], "TIS + gate + repair"),
                              (["--gate-segment", "0"], "--gate-segment '0'"),
                              (["--eval-split", "train"], "unknown evaluation split 'train'"),
                              (["--task", "cumsum", "--difficulty", "11"],
                               "--max-new 8 cannot hold the answer")):
            r = run("train", "--model", self.model, "--out", out, *extra, check=False)
            self.assertEqual(r.returncode, 2, f"{extra}: {r.stderr}")
            self.assertIn("lockstep: error:", r.stderr)
            self.assertIn(needle, r.stderr, extra)
            self.assertFalse(os.path.exists(out), extra)


if __name__ == "__main__":
    unittest.main()
