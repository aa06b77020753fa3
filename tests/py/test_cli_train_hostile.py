#!/usr/bin/env python3
"""What a hostile new user did to `lockstep train`, `pretrain` and `compare`, each case held by one
test on a micro model: two processes on one run folder, a resume after a metrics row cut short,
output folders that cannot be written (found before the warm start), a run folder inside its own
input, a recipe named twice, a group of one, --dry-run, and the checkpoint read once.

Run: python3 tests/py/test_cli_train_hostile.py PATH_TO_lockstep_BINARY
"""
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_util import (load_json, init_micro_model, read_text, rows, run_lockstep,  # noqa: E402
                        tree_digest, untimed)

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_cli_train_hostile.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))

SMALL = ["--steps", "6", "--prompts", "4", "--group", "4", "--max-new", "4", "--eval-prompts", "8",
         "--eval-every", "3", "--checkpoint-every", "2", "--format-bonus", "0.5", "--lr", "0.01",
         "--difficulty", "1"]
# The warm start of a preset, as small as it gets (found in a fresh cache folder each time).
WARM = ["--preset", "tiny-dense", "--pretrain-steps", "2", "--pretrain-batch", "4", "--steps", "1",
        "--prompts", "2", "--group", "2", "--eval-prompts", "4"]


def run(*args, **kw):
    return run_lockstep(LOCKSTEP, *args, **kw)


class TrainHostile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lockstep-train-hostile-")
        cls.model = os.path.join(cls.tmp, "micro")
        init_micro_model(LOCKSTEP, cls.model)
        cls.ref = os.path.join(cls.tmp, "ref")
        run("train", "--model", cls.model, "--out", cls.ref, *SMALL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def refused(self, r, *needles):
        self.assertEqual(r.returncode, 2, f"stdout={r.stdout!r} stderr={r.stderr!r}")
        self.assertIn("lockstep: error:", r.stderr)
        for n in needles:
            self.assertIn(n, r.stderr)

    def start_and_wait_for_checkpoint(self, out, steps):
        args = [LOCKSTEP, "train", "--model", self.model, "--out", out, "--steps", str(steps),
                *SMALL[2:]]
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        state = os.path.join(out, "checkpoint", "trainer.json")
        deadline = time.time() + 240
        while time.time() < deadline and p.poll() is None:
            try:
                if load_json(state)["step"] >= 2:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.005)
        return p

    # ---- 2. one process per run folder ------------------------------------------------------------

    def test_a_second_process_on_a_running_run_is_refused(self):
        d = self.path("locked")
        p = self.start_and_wait_for_checkpoint(d, 400)
        try:
            self.assertIsNone(p.poll(), "the first run ended before the second one started")
            before = read_text(os.path.join(d, "metrics.jsonl"))
            r = run("train", "--resume", d, check=False)
            self.refused(r, d, "in use by another lockstep process", f"pid {p.pid}")
            self.assertTrue(read_text(os.path.join(d, "metrics.jsonl")).startswith(before))
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
        # The kernel drops the lock with the process, kill -9 included: it can be taken again.
        with open(os.path.join(d, ".lock"), "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)

    # ---- 7. resume after a metrics row cut short ----------------------------------------------------

    def copy_ref(self, name):
        d = self.path(name)
        shutil.copytree(self.ref, d)
        return d

    def test_a_row_cut_short_at_the_checkpoint_is_an_error_naming_the_line(self):
        # The finished run's checkpoint is at step 6; its row (line 7) loses its end.
        d = self.copy_ref("cut")
        path = os.path.join(d, "metrics.jsonl")
        lines = read_text(path).splitlines(keepends=True)
        with open(path, "w") as f:
            f.write("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
        before = tree_digest(d)
        r = run("train", "--resume", d, check=False)
        self.refused(r, "metrics.jsonl:7", "cut short", "step 6")
        self.assertEqual(tree_digest(d), before)

    def test_an_unreadable_row_before_the_checkpoint_is_an_error_naming_the_line(self):
        d = self.copy_ref("garbled")
        path = os.path.join(d, "metrics.jsonl")
        lines = read_text(path).splitlines(keepends=True)
        lines[2] = "{\"step\": 2, garbage\n"
        with open(path, "w") as f:
            f.write("".join(lines))
        self.refused(run("train", "--resume", d, check=False), "metrics.jsonl:3")
        del lines[2]
        with open(path, "w") as f:
            f.write("".join(lines))
        self.refused(run("train", "--resume", d, check=False), "metrics.jsonl:3",
                     "row of step 3 where the row of step 2 belongs")

    def test_rows_after_the_checkpoint_are_cut_and_rewritten(self):
        d = self.path("killed")
        p = self.start_and_wait_for_checkpoint(d, 8)
        p.send_signal(signal.SIGKILL)
        p.wait()
        step = load_json(os.path.join(d, "checkpoint", "trainer.json"))["step"]
        with open(os.path.join(d, "metrics.jsonl"), "a") as f:
            f.write('{"step": %d, "reward_mean": 0.5, "accur' % (step + 1))  # a write cut short
        run("train", "--resume", d)
        full = self.path("unkilled")
        run("train", "--model", self.model, "--out", full, "--steps", "8", *SMALL[2:])
        self.assertEqual(untimed(rows(d)), untimed(rows(full)))

    # ---- 9. every output location before any work --------------------------------------------------

    def test_unwritable_outputs_are_found_before_the_warm_start(self):
        blocker = self.path("a_file")
        with open(blocker, "w") as f:
            f.write("not a folder")
        cache = self.path("fresh-cache")
        cases = [
            (["train", *WARM, "--cache-dir", cache, "--out", os.path.join(blocker, "run")], "--out"),
            (["train", *WARM, "--cache-dir", os.path.join(blocker, "cache"), "--out", self.path("r9")],
             "--cache-dir"),
            (["train", *WARM, "--cache-dir", os.path.join(self.path("r9b"), "c"), "--out", self.path("r9b")],
             "inside the run folder"),
            (["pretrain", "--model", self.model, "--steps", "2", "-o", os.path.join(blocker, "m")], "-o"),
            (["compare", "--model", self.model, "--recipes", "bf16", "--guards", "none",
              "--out", os.path.join(blocker, "c")], "--out"),
        ]
        for args, needle in cases:
            with self.subTest(args=args):
                t0 = time.monotonic()
                r = run(*args, check=False)
                self.refused(r, needle)
                self.assertNotIn("warm start", r.stderr)
                self.assertLess(time.monotonic() - t0, 60)
        self.assertFalse(os.path.exists(cache))
        self.assertFalse(os.path.exists(self.path("r9")))
        self.assertFalse(os.path.exists(self.path("r9b")))
        if os.geteuid() != 0:  # root writes through permission bits
            ro = self.path("read-only")
            os.mkdir(ro, 0o555)
            self.refused(run("train", "--model", self.model, "--out", os.path.join(ro, "x"), check=False),
                         "cannot create folders")

    def test_outputs_never_land_in_the_input_model(self):
        before = tree_digest(self.model)
        self.refused(run("train", "--model", self.model, "--out", os.path.join(self.model, "run"),
                         *SMALL, check=False), "inside the input folder")
        self.refused(run("pretrain", "--model", self.model, "--steps", "2",
                         "-o", os.path.join(self.model, "sub"), check=False), "inside the input folder")
        self.assertEqual(tree_digest(self.model), before)

    # ---- 10, 12. duplicates, a group of one, --dry-run -----------------------------------------------

    def test_duplicate_recipes_and_guards_are_refused_up_front(self):
        for flag, value in (("--recipes", "bf16,bf16"), ("--guards", "tis,none,tis")):
            out = self.path("cmp-" + flag.strip("-"))
            r = run("compare", "--model", self.model, flag, value, "--out", out, *SMALL, check=False)
            self.refused(r, flag, "given twice")
            self.assertFalse(os.path.exists(out))

    def test_a_group_of_one_is_refused(self):
        out = self.path("g1")
        args = [a if prev != "--group" else "1" for prev, a in zip([None, *SMALL], SMALL)]
        self.refused(run("train", "--model", self.model, "--out", out, *args, check=False),
                     "--group 1", "would train nothing")
        self.assertFalse(os.path.exists(out))

    def test_dry_run_checks_everything_and_writes_nothing(self):
        cache = self.path("dry-cache")
        out = self.path("dry")
        for args in (["train", *WARM, "--cache-dir", cache, "--out", out],
                     ["train", "--model", self.model, "--out", out, *SMALL],
                     ["pretrain", "--model", self.model, "--steps", "2", "-o", out],
                     ["compare", *WARM, "--cache-dir", cache, "--recipes", "bf16,mxfp8", "--out", out]):
            with self.subTest(args=args[:2]):
                r = run(*args, "--dry-run")
                self.assertIn("dry run: nothing was run and nothing was created", r.stdout)
                self.assertIn("would run:", r.stdout)
                self.assertFalse(os.path.exists(out))
                self.assertFalse(os.path.exists(cache))
        r = run("train", *WARM, "--cache-dir", cache, "--out", out, "--dry-run")
        self.assertIn("a warm start of at most 2 steps", r.stdout)
        # A dry run validates: a model that does not exist is an error in it too.
        self.refused(run("train", "--model", self.path("nope"), "--out", out, "--dry-run", check=False),
                     "nope")

    # ---- 3 (house): a checkpoint is read once at train start ----------------------------------------

    @unittest.skipUnless(shutil.which("strace"), "strace is not installed")
    def test_the_checkpoint_is_read_once(self):
        out = self.path("from-ckpt")
        trace = self.path("trace.txt")
        ck = os.path.join(self.ref, "checkpoint")
        # LeakSanitizer cannot run under ptrace: off for this one traced run (a sanitizer build).
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        subprocess.run(["strace", "-f", "-e", "trace=openat", "-o", trace, LOCKSTEP, "train",
                        "--model", ck, "--out", out, *SMALL[:1], "1", *SMALL[2:]],
                       check=True, capture_output=True, timeout=300, env=env)
        opens = [line for line in read_text(trace).splitlines()
                 if os.path.join(ck, "learner.safetensors") in line]
        self.assertEqual(len(opens), 1, "".join(opens))


if __name__ == "__main__":
    unittest.main()
