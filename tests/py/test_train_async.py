#!/usr/bin/env python3
"""`lockstep train --async-rollout 1` on a micro Qwen3-MoE model: step k trains on the batch that
policy version max(0, k - 2) sampled while step k - 1 trained, and its rows say so
(rollout_policy_version, policy_lag, time_rollout_gen_s); two runs, and a run killed with SIGKILL
after a checkpoint and resumed, give the same metrics.jsonl rows (timing keys aside) and checkpoint
bytes; with --deterministic the learner-sampler gap is the lag alone (0 at step 1); 1 and 2
learner ranks give the same bits; a resume that asks for another --async-rollout is
refused (exit 2, naming the flag, nothing changed), and so is --async-rollout 2.

Run: python3 tests/py/test_train_async.py PATH_TO_lockstep_BINARY
LOCKSTEP_TEST_DEVICE=cuda runs the trainings on the GPU (the learner-rank case stays on the CPU);
unset, they run on the CPU.
"""
import os
import shutil
import signal
import sys
import tempfile
import unittest

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_train_async.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import (checkpoint_digest, kill_after_checkpoint, load_json,  # noqa: E402
                        init_micro_model, rows, run_lockstep, tree_digest, untimed)

DEVICE = os.environ.get("LOCKSTEP_TEST_DEVICE", "") or "cpu"
# The micro run of test_train_cli.py (rewards vary, so the policy moves every step and a batch
# sampled one version earlier differs from the synchronous run's).
SMALL = ["--prompts", "4", "--group", "4", "--max-new", "4", "--eval-prompts", "8",
         "--eval-every", "3", "--checkpoint-every", "2", "--format-bonus", "0.5", "--lr", "0.01",
         "--difficulty", "1"]


def small(steps, device=DEVICE):
    return ["--steps", str(steps), *SMALL, "--device", device]


def run(*args, **kw):
    return run_lockstep(LOCKSTEP, *args, **kw)


class TrainAsync(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lockstep-async-")
        cls.model = os.path.join(cls.tmp, "micro")
        init_micro_model(LOCKSTEP, cls.model)
        # The uninterrupted reference run, shared by the tests.
        cls.ref = cls.train_dir("ref", "--async-rollout", "1", steps=12)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def train_dir(cls, name, *args, steps=12, device=DEVICE):
        d = os.path.join(cls.tmp, name)
        run("train", "--model", cls.model, "--out", d, *small(steps, device), *args)
        return d

    def test_rows_record_the_version_that_sampled_the_batch(self):
        rs = rows(self.ref)
        self.assertEqual([r["step"] for r in rs], list(range(13)))
        for r in rs[1:]:
            k = r["step"]
            self.assertEqual(r["policy_version"], k)
            self.assertEqual(r["rollout_policy_version"], max(0, k - 2), f"step {k}")
            self.assertEqual(r["policy_lag"], 0.0 if k == 1 else 1.0, f"step {k}")
            self.assertGreaterEqual(r["time_rollout_gen_s"], 0.0)
            self.assertGreaterEqual(r["time_rollout_s"], 0.0)
        self.assertTrue(any(r["grad_norm"] > 0 for r in rs[1:]), "the policy moves")
        meta = load_json(os.path.join(self.ref, "run_meta.json"))
        self.assertEqual(meta["async_rollout"], 1)
        self.assertEqual(meta["options"]["async_rollout"], 1)
        # The synchronous run shares step 1 (version 0's batch either way), then the batches part.
        sync = self.train_dir("sync", steps=12)
        s = untimed(rows(sync))
        a = untimed(rows(self.ref))
        self.assertEqual(s[:2], a[:2])
        for r in s[1:]:
            self.assertEqual(r["rollout_policy_version"], r["step"] - 1)
            self.assertEqual(r["policy_lag"], 0.0)
        self.assertNotIn("time_rollout_gen_s", rows(sync)[1])
        versions = ("rollout_policy_version", "policy_lag")
        self.assertNotEqual([{k: v for k, v in r.items() if k not in versions} for r in s],
                            [{k: v for k, v in r.items() if k not in versions} for r in a])

    def test_runs_repeat_and_sigkill_then_resume_matches(self):
        again = self.train_dir("again", "--async-rollout", "1", steps=12)
        self.assertEqual(untimed(rows(again)), untimed(rows(self.ref)))
        self.assertEqual(checkpoint_digest(again), checkpoint_digest(self.ref))

        d = os.path.join(self.tmp, "killed")
        rc = kill_after_checkpoint([LOCKSTEP, "train", "--model", self.model, "--out", d,
                                    *small(12), "--async-rollout", "1"], d, 2)
        if rc == 0:
            self.skipTest("the run finished before it could be killed")
        self.assertEqual(rc, -signal.SIGKILL)
        state = os.path.join(d, "checkpoint", "trainer.json")
        st = load_json(state)
        killed_at = st["step"]
        self.assertLess(killed_at, 12)
        # The checkpoint holds the next step's batch, sampled by the version before its own.
        self.assertEqual(st["pending_rollout"]["step"], killed_at + 1)
        self.assertEqual(st["pending_rollout"]["policy_version"], killed_at - 1)
        self.assertTrue(os.path.exists(os.path.join(d, "checkpoint", "rollout.safetensors")))
        r = run("train", "--resume", d, "--device", DEVICE)
        self.assertIn("rollouts overlapped with training", r.stderr)
        # On one GPU the start line says that the background sampler shares it.
        self.assertEqual("sharing the learner's GPU" in r.stderr, DEVICE.startswith("cuda"))
        self.assertEqual(untimed(rows(d)), untimed(rows(self.ref)), f"killed at {killed_at}")
        self.assertEqual(checkpoint_digest(d), checkpoint_digest(self.ref))
        self.assertIsNone(load_json(state)["pending_rollout"])

    def test_deterministic_gap_is_the_lag_alone(self):
        # One shared contract and --deterministic: learner == sampler bits at the same version,
        # so the gap is 0 on the batch of the current version (step 1) and is the lag after.
        d = self.train_dir("det", "--async-rollout", "1", "--deterministic", steps=6)
        rs = rows(d)
        self.assertEqual(rs[1]["max_abs_gap"], 0.0)
        moved = [r["step"] for r in rs[1:6] if r["grad_norm"] > 0]
        self.assertTrue(moved, "the policy moves")
        # The first step after a moving update trains on a batch of the version before it.
        k = moved[0] + 1
        self.assertGreater(rs[k]["max_abs_gap"], 0.0, f"step {k}")

    def test_learner_ranks_give_the_same_bits(self):
        one = self.train_dir("ranks1", "--async-rollout", "1", "--grad-slots", "2", steps=6,
                             device="cpu")
        two = self.train_dir("ranks2", "--async-rollout", "1", "--grad-slots", "2",
                             "--learner-ranks", "2", steps=6, device="cpu")
        self.assertEqual(untimed(rows(two)), untimed(rows(one)))
        self.assertEqual(checkpoint_digest(two), checkpoint_digest(one))

    def test_resume_with_another_value_is_refused(self):
        d = self.train_dir("refused", "--async-rollout", "1", steps=2)
        sync = self.train_dir("refused-sync", steps=2)
        for folder, value, run_value in ((d, "0", "1"), (sync, "1", "0")):
            before = tree_digest(folder)
            r = run("train", "--resume", folder, "--async-rollout", value, check=False)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("lockstep: error:", r.stderr)
            self.assertIn(f"--async-rollout {value} differs from the run's --async-rollout "
                          f"{run_value}", r.stderr)
            self.assertEqual(tree_digest(folder), before, "a refused resume changed nothing")
            # The run's own value is accepted (the run is complete: nothing more to train).
            r = run("train", "--resume", folder, "--async-rollout", run_value, "--device",
                    DEVICE)
            self.assertIn("steps 2/2", r.stdout)

    def test_async_rollout_2_is_refused(self):
        root = os.path.join(self.tmp, "two")
        os.makedirs(root)
        r = run("train", "--model", self.model, "--out", os.path.join(root, "run"), *small(2),
                "--async-rollout", "2", check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--async-rollout", r.stderr)
        self.assertEqual(os.listdir(root), [], "a refused run wrote nothing")


if __name__ == "__main__":
    unittest.main()
