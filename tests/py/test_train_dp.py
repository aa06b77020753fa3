#!/usr/bin/env python3
"""`lockstep train --grad-slots M --learner-ranks N` on a micro Qwen3-MoE model: 1, 2 and 4
data-parallel learner ranks (threads over the fake transport) with the same M give the same
metrics.jsonl rows (timing keys aside) and the same checkpoint bytes; a run stopped after a
checkpoint resumes on another rank count with the same bits; run_meta.json records M and N; slot
and rank counts that do not fit are refused (exit 2, the problem named, nothing written).

Run: python3 tests/py/test_train_dp.py PATH_TO_lockstep_BINARY
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_train_dp.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import (checkpoint_digest, load_json, init_micro_model, read_text,  # noqa: E402
                        rows, run_lockstep, untimed)

# The micro run of test_train_cli.py (the policy moves every step), on the CPU: the ranks here are
# CPU threads.
SMALL = ["--prompts", "4", "--group", "4", "--max-new", "4", "--eval-prompts", "8",
         "--eval-every", "3", "--checkpoint-every", "2", "--format-bonus", "0.5", "--lr", "0.01",
         "--difficulty", "1", "--device", "cpu"]


def small(steps=6):
    return ["--steps", str(steps), *SMALL]


def run(*args, **kw):
    return run_lockstep(LOCKSTEP, *args, **kw)


class TrainDataParallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lockstep-dp-")
        cls.model = os.path.join(cls.tmp, "micro")
        init_micro_model(LOCKSTEP, cls.model)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def train(self, name, *args, steps=6):
        d = self.path(name)
        run("train", "--model", self.model, "--out", d, *small(steps), *args)
        return d

    def test_one_two_and_four_ranks_give_the_same_bits(self):
        for extra in ([], ["--minibatches", "2", "--routing-replay", "--guard", "triage"]):
            tag = "-".join(extra) or "plain"
            one = self.train(f"same-{tag}-1", "--grad-slots", "4", *extra)
            for n in ("2", "4"):
                d = self.train(f"same-{tag}-{n}", "--grad-slots", "4", "--learner-ranks", n,
                               *extra)
                self.assertEqual(untimed(rows(d)), untimed(rows(one)), f"{n} ranks, {tag}")
                self.assertEqual(checkpoint_digest(d), checkpoint_digest(one), f"{n} ranks, {tag}")
                meta = load_json(os.path.join(d, "run_meta.json"))
                self.assertEqual(meta["options"]["grad_slots"], 4)
                self.assertEqual(meta["learner_ranks"], int(n))
                self.assertIn("fake transport", meta["learner_group"])
                state = load_json(os.path.join(d, "checkpoint", "trainer.json"))
                self.assertEqual(state["learner_ranks"], int(n))
            # The policy moved, so equal bits are not equal nothing.
            self.assertTrue(any(r["grad_norm"] > 0 for r in rows(one)[1:]))

    def test_one_slot_is_the_default_run(self):
        plain = self.train("default")
        one = self.train("slots1", "--grad-slots", "1", "--learner-ranks", "1")
        self.assertEqual(untimed(rows(one)), untimed(rows(plain)))
        self.assertEqual(checkpoint_digest(one), checkpoint_digest(plain))
        self.assertEqual(load_json(os.path.join(plain, "run_meta.json"))["options"]["grad_slots"],
                         1)

    def test_resume_on_another_rank_count_gives_the_same_bits(self):
        full = self.train("resume-full", "--grad-slots", "4", steps=24)
        for first, then in (("4", "1"), ("1", "2")):
            d = self.path(f"resume-{first}-{then}")
            # SIGINT after the first rows: the run ends after the current step with a checkpoint.
            p = subprocess.Popen([LOCKSTEP, "train", "--model", self.model, "--out", d, *small(24),
                                  "--grad-slots", "4", "--learner-ranks", first],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            metrics = os.path.join(d, "metrics.jsonl")
            deadline = time.time() + 120
            while time.time() < deadline and p.poll() is None:
                if os.path.exists(metrics) and len(read_text(metrics).splitlines()) >= 3:
                    break
                time.sleep(0.002)
            p.send_signal(signal.SIGINT)
            p.wait()
            stopped = load_json(os.path.join(d, "checkpoint", "trainer.json"))["step"]
            if p.returncode == 0:
                self.skipTest("the run finished before it could be interrupted")
            self.assertEqual(p.returncode, 130)
            self.assertLess(stopped, 24)
            r = run("train", "--resume", d, "--learner-ranks", then, "--device", "cpu")
            self.assertIn(f"{then} learner rank", r.stderr)
            self.assertEqual(untimed(rows(d)), untimed(rows(full)), f"{first} then {then} ranks")
            self.assertEqual(checkpoint_digest(d), checkpoint_digest(full))
            self.assertEqual(load_json(os.path.join(d, "checkpoint", "trainer.json"))
                             ["learner_ranks"], int(then))

    def test_slots_and_ranks_that_do_not_fit_are_refused(self):
        cases = (
            (["--grad-slots", "3"], "--grad-slots 3 must be a power of two"),
            (["--grad-slots", "32"], "--grad-slots 32 is more than the 16 sequences of a minibatch"),
            (["--grad-slots", "16", "--minibatches", "2"],
             "--grad-slots 16 is more than the 8 sequences of a minibatch"),
            (["--grad-slots", "2", "--learner-ranks", "4"],
             "--grad-slots 2 is not a multiple of the 4 learner ranks"),
            (["--learner-ranks", "4"], "--grad-slots 1 is not a multiple of the 4 learner ranks"),
            (["--grad-slots", "4", "--learner-ranks", "3"],
             "--learner-ranks 3: the count must be a power of two"),
            (["--learner-ranks", "2", "--gpus", "2:0"], "--gpus 2:0"),
            (["--grad-slots", "0"], "--grad-slots"),
        )
        for i, (args, needle) in enumerate(cases):
            for dry in ([], ["--dry-run"]):
                root = self.path(f"refused{i}{len(dry)}")
                os.makedirs(root)
                r = run("train", "--model", self.model, "--out", os.path.join(root, "run"),
                        "--cache-dir", os.path.join(root, "cache"), *small(), *args, *dry,
                        check=False)
                self.assertEqual(r.returncode, 2, f"{args}: {r.stderr}")
                self.assertIn("lockstep: error:", r.stderr)
                self.assertIn(needle, r.stderr)
                self.assertEqual(os.listdir(root), [], f"{args}: a refused run wrote nothing")

    def test_resume_refuses_a_rank_count_the_run_cannot_use(self):
        d = self.train("resume-refused", "--grad-slots", "2", steps=2)
        before = checkpoint_digest(d), read_text(os.path.join(d, "metrics.jsonl"))
        r = run("train", "--resume", d, "--learner-ranks", "4", check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--grad-slots 2 is not a multiple of the 4 learner ranks", r.stderr)
        self.assertEqual((checkpoint_digest(d), read_text(os.path.join(d, "metrics.jsonl"))),
                         before)


if __name__ == "__main__":
    unittest.main()
