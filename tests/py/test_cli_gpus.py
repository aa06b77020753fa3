#!/usr/bin/env python3
"""`lockstep train --gpus L:S` and `--async-rollout`: a request for more GPUs than the machine has
is refused before any work (exit 2, naming how many CUDA devices were found and why none), so are
more than one sampler GPU, a learner count that is not a power of two and an --async-rollout other
than 0 or 1; malformed values name the flag, and 1:0 (or 1) is the single-device run. Nothing is
written by a refused command. (The data-parallel bits themselves: test_train_dp.py; overlapped
rollouts: test_train_async.py.)

Run: python3 tests/py/test_cli_gpus.py PATH_TO_lockstep_BINARY
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import run_lockstep  # noqa: E402

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_cli_gpus.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))


def run(*args, **kw):
    return run_lockstep(LOCKSTEP, *args, **kw)


class TrainGpus(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lockstep-gpus-")
        doctor = json.loads(run("doctor", "--json").stdout)
        cls.gpus = len(doctor["gpus"])
        cls.cuda_error = doctor["cuda"]["error"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def train(self, *args, name="run"):
        """train with its run folder and warm-start cache in a fresh folder; returns the result and
        that folder's entries afterwards."""
        root = os.path.join(self.tmp, name)
        os.makedirs(root)
        r = run("train", "--out", os.path.join(root, "run"), "--cache-dir",
                os.path.join(root, "cache"), *args, check=False)
        return r, sorted(os.listdir(root))

    def refused(self, r, *needles):
        self.assertEqual(r.returncode, 2, f"stdout={r.stdout!r} stderr={r.stderr!r}")
        self.assertIn("lockstep: error:", r.stderr)
        for n in needles:
            self.assertIn(n, r.stderr)

    def test_more_gpus_than_found_is_refused_naming_what_was_found(self):
        for i, args in enumerate((["--gpus", "2:1", "--dry-run"], ["--gpus", "2:1"])):
            r, left = self.train(*args, name=f"over{i}")
            if self.gpus >= 3:
                # Enough GPUs: the dry run passes (the real run is not started here).
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("2 learner ranks", r.stderr + r.stdout)
                break
            else:
                self.refused(r, f"--gpus 2:1 asks for 3 GPUs (2 learner, 1 sampler); this machine "
                             f"has {self.gpus} CUDA device(s)")
                if self.gpus == 0:
                    self.assertIn(self.cuda_error, r.stderr)
            self.assertEqual(left, [], "a refused run wrote nothing")
        r, left = self.train("--gpus", "1000:24", name="far")
        self.refused(r, "--gpus 1000:24 asks for 1024 GPUs", f"has {self.gpus} CUDA device(s)")
        self.assertEqual(left, [])

    def test_n_alone_means_n_learners(self):
        r, left = self.train("--gpus", "4", "--dry-run", name="n")
        if self.gpus < 4:
            self.refused(r, "--gpus 4:0 asks for 4 GPUs (4 learner, 0 sampler)")
        else:
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(left, [])

    def test_shapes_that_are_not_implemented_are_refused(self):
        # Checked after the GPU count: a machine with too few GPUs names that first.
        for value, needle in (("1:2", "more than one sampler GPU is not implemented"),
                              ("3:0", "the count must be a power of two")):
            r, left = self.train("--gpus", value, name=f"shape{value.replace(':', '-')}")
            want = sum(int(x) for x in value.split(":"))
            self.refused(r, f"asks for {want} GPUs" if self.gpus < want else needle)
            self.assertEqual(left, [])

    def test_malformed_values_name_the_flag(self):
        for value in ("0:1", "2:x", ":1", "1:", "-1", "1:0:0", "", "2:-1"):
            r, left = self.train("--gpus", value, name=f"bad{abs(hash(value))}")
            self.refused(r, "--gpus")
            self.assertEqual(left, [], value)

    def test_async_rollout_takes_0_or_1(self):
        for value in ("2", "-1", "x"):
            r, left = self.train("--async-rollout", value, name=f"async{abs(hash(value))}")
            self.refused(r, "--async-rollout")
            self.assertEqual(left, [])
        r, left = self.train("--async-rollout", "1", "--dry-run", name="async1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("rollouts overlapped with training", r.stdout + r.stderr)
        self.assertEqual(left, [], "a dry run writes nothing")

    def test_one_gpu_is_the_single_device_run(self):
        for i, value in enumerate(("1:0", "1")):
            r, left = self.train("--gpus", value, "--async-rollout", "0", "--dry-run",
                                 name=f"one{i}")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(left, [], "a dry run writes nothing")

    def test_resume_keeps_the_run_options(self):
        # --gpus and --learner-ranks place a resumed run (its bits do not depend on them); the
        # GPU count is checked before the folder is read. --async-rollout is a run option, taken
        # only as the run's own value (test_train_async.py).
        none = os.path.join(self.tmp, "none")
        r = run("train", "--resume", none, "--async-rollout", "0", check=False)
        self.refused(r, "is not a folder")
        r = run("train", "--resume", none, "--steps", "3", check=False)
        self.refused(r, "drop --steps")
        r = run("train", "--resume", none, "--gpus", "1:0", check=False)
        self.refused(r, "is not a folder")
        if self.gpus < 2:
            r = run("train", "--resume", none, "--gpus", "2", check=False)
            self.refused(r, "--gpus 2:0 asks for 2 GPUs")


if __name__ == "__main__":
    unittest.main()
