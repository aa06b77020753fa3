#!/usr/bin/env python3
"""Flag values and model values a hostile new user tried, each case held by one test: one integer
parser for every command (no "-1" wrapping to 2^64 - 1, no "0x5"), finite reals, parser errors
with lockstep's prefix, a recipe in the environment that a command without recipes ignores,
options that mean nothing without another, token ids outside the vocabulary, non-finite weights
and log-probs, and --dry-run on the model commands.

Usage: python3 tests/py/test_cli_values.py PATH_TO_lockstep [unittest args]
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from safetensors.numpy import load_file, save_file

BIN = None


def run(*args, timeout=120, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=e)


class Case(unittest.TestCase):
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="lockstep_values_")
        cls.tmp = cls._tmp.name
        cls.model = os.path.join(cls.tmp, "model")
        p = run("init", "--preset", "tiny-dense", "-o", cls.model, "--seed", "2")
        assert p.returncode == 0, p.stderr
        cls.inp = os.path.join(cls.tmp, "in.st")
        save_file({"w": np.linspace(-3, 3, 64 * 64, dtype=np.float32).reshape(64, 64)}, cls.inp)
        cls.prompts = os.path.join(cls.tmp, "prompts.jsonl")
        with open(cls.prompts, "w") as f:
            f.write("[1, 5, 9]\n[3, 4]\n")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)

    def assert_refused(self, p, *needles):
        self.assertEqual(p.returncode, 2, f"stdout={p.stdout!r} stderr={p.stderr!r}")
        self.assertTrue(p.stderr.startswith("lockstep: error:"), p.stderr)
        for n in needles:
            self.assertIn(n, p.stderr)

    def copy_model_with(self, name, edit):
        """A copy of the model whose model.safetensors tensors pass through edit(dict)."""
        out = self.path(name)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(self.model, "config.json")) as f:
            cfg = f.read()
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write(cfg)
        t = load_file(os.path.join(self.model, "model.safetensors"))
        edit(t)
        save_file(t, os.path.join(out, "model.safetensors"))
        return out


# ---- 8. one integer parser for every command; finite reals -----------------------------------------

class IntegerAndRealFlags(Case):
    def test_negative_hex_and_out_of_range_integers_are_refused(self):
        m = self.path("never")
        cases = [
            (["init", "--preset", "tiny-dense", "-o", m, "--seed", "-1"], "--seed '-1'"),
            (["init", "--preset", "tiny-dense", "-o", m, "--seed", "0x5"], "--seed '0x5'"),
            (["init", "--preset", "tiny-dense", "-o", m, "--max-shard-bytes", "-1"], "--max-shard-bytes '-1'"),
            (["sample", "--model", self.model, "--prompts", self.prompts, "--seed", "-1"], "--seed '-1'"),
            (["sample", "--preset", "tiny-dense", "--init-seed", "-1", "--prompts", self.prompts], "--init-seed '-1'"),
            (["sample", "--model", self.model, "--prompts", self.prompts, "--max-new", "1e3"], "--max-new '1e3'"),
            (["sample", "--model", self.model, "--prompts", self.prompts, "--top-k", "-2"], "--top-k '-2'"),
            (["align", "--preset", "tiny-dense", "--recipe", "bf16", "--seed", "-1"], "--seed '-1'"),
            (["align", "--preset", "tiny-dense", "--recipe", "bf16", "--batch", "0"], "--batch '0'"),
            (["forward", "--preset", "tiny-dense", "--init-seed", "18446744073709551616", "--tokens",
              self.inp, "-o", self.path("o.st")], "--init-seed"),
            (["describe", "--layers", "5.5"], "--layers '5.5'"),
            (["train", "--pretrain-steps", "-5", "--out", m], "--pretrain-steps '-5'"),
            (["train", "--seed", "-1", "--out", m], "--seed '-1'"),
            (["train", "--steps", "+3", "--out", m], "--steps '+3'"),
            (["pretrain", "--steps", "-5", "-o", m], "--steps '-5'"),
            (["compare", "--prompts", "0x10", "--out", m], "--prompts '0x10'"),
            (["bench", "quantize", "--runs", "-1"], "--runs '-1'"),
        ]
        for args, needle in cases:
            with self.subTest(args=args):
                self.assert_refused(run(*args), needle, "decimal digits only")
        self.assertFalse(os.path.exists(m))

    def test_reals_must_be_finite_and_in_range(self):
        for flag, value in (("--temperature", "inf"), ("--temperature", "nan"), ("--temperature", "0"),
                            ("--top-p", "1.5"), ("--temperature", "1e999")):
            with self.subTest(flag=flag, value=value):
                self.assert_refused(run("sample", "--model", self.model, "--prompts", self.prompts,
                                        flag, value), f"{flag} '{value}'", "finite")
        self.assert_refused(run("train", "--lr", "nan", "--out", self.path("never")), "--lr 'nan'")
        self.assert_refused(run("align", "--preset", "tiny-dense", "--recipe", "bf16", "--temperature",
                                "-inf"), "--temperature '-inf'")

    def test_parser_errors_carry_the_prefix(self):
        for args in (["quantize"], ["quantize", self.inp, "-o", self.path("o.st"), "--bogus"],
                     ["init", "--preset"], ["train", "--steps"]):
            with self.subTest(args=args):
                p = run(*args)
                self.assert_refused(p)
        self.assertEqual(run("quantize", "--help").returncode, 0)


# ---- 12. options that need another; a recipe the command never uses -------------------------------

class OptionCombinations(Case):
    def test_seed_and_stream_need_stochastic(self):
        for flag in ("--seed", "--stream"):
            with self.subTest(flag=flag):
                self.assert_refused(run("quantize", self.inp, "-o", self.path("o.st"), "--format", "nvfp4",
                                        flag, "3"), f"{flag} applies to --stochastic")
        self.assertFalse(os.path.exists(self.path("o.st")))

    def test_a_bad_environment_recipe_does_not_break_commands_without_recipes(self):
        env = {"LOCKSTEP_RECIPE": "garbage"}
        q, meta = self.path("q.st"), self.path("meta.json")
        p = run("quantize", self.inp, "-o", q, "--format", "nvfp4", "--run-meta", meta, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(meta) as f:
            self.assertIsNone(json.load(f)["recipe"])
        for args in (["dequantize", q, "-o", self.path("dq.st")],
                     ["gemm", "--a", self.inp, "--w", self.inp, "-o", self.path("d.st")],
                     ["sweep", "--rows", "16", "--cols", "64"],
                     ["init", "--preset", "tiny-dense", "-o", self.path("m_env")],
                     ["quantize", self.inp, "-o", self.path("q2.st"), "--dry-run"]):
            with self.subTest(cmd=args[0]):
                p = run(*args, env=env)
                self.assertEqual(p.returncode, 0, p.stderr)
        # A command that runs with a recipe still refuses it.
        self.assert_refused(run("align", "--preset", "tiny-dense", "--dry-run", env=env), "garbage")


# ---- 12, 11. token ids outside the vocabulary; non-finite weights and log-probs --------------------

class ModelValues(Case):
    def test_eos_outside_the_vocabulary_is_refused(self):
        with open(os.path.join(self.model, "config.json")) as f:
            cfg = json.load(f)
        cfg["eos_token_id"] = cfg["vocab_size"] + 7
        bad = self.path("eos.json")
        with open(bad, "w") as f:
            json.dump(cfg, f)
        self.assert_refused(run("init", "--config", bad, "-o", self.path("m_eos")), "eos_token_id")
        self.assertFalse(os.path.exists(self.path("m_eos")))
        self.assert_refused(run("sample", "--model", self.model, "--prompts", self.prompts, "--eos",
                                str(cfg["vocab_size"])), "--eos", "outside the vocabulary")

    def test_a_nan_weight_is_refused_at_load_naming_the_tensor(self):
        def poison(t):
            t["model.layers.0.mlp.up_proj.weight"][3, 5] = np.nan
        bad = self.copy_model_with("nan_model", poison)
        ids = self.path("ids.st")
        save_file({"ids": np.array([1, 5, 9], np.int32)}, ids)
        for args in (["forward", "--model", bad, "--tokens", ids, "-o", self.path("l.st")],
                     ["sample", "--model", bad, "--prompts", self.prompts],
                     ["align", "--model", bad, "--recipe", "bf16"],
                     ["inspect", bad]):
            with self.subTest(cmd=args[0]):
                self.assert_refused(run(*args), "model.layers.0.mlp.up_proj.weight", "non-finite")
        self.assertFalse(os.path.exists(self.path("l.st")))

    def test_overflowing_logits_are_errors_never_null_or_zero(self):
        def huge(t):  # finite weights whose logits overflow fp32 (tied embeddings: the head)
            t["model.norm.weight"][:] = np.float32(3e38)
            t["model.embed_tokens.weight"][:] = np.float32(1)
        bad = self.copy_model_with("huge_model", huge)
        ids = self.path("ids.st")
        save_file({"ids": np.array([1, 5, 9], np.int32)}, ids)
        self.assert_refused(run("forward", "--model", bad, "--tokens", ids, "-o", self.path("l.st")),
                            "not finite")
        self.assertFalse(os.path.exists(self.path("l.st")))
        self.assert_refused(run("sample", "--model", bad, "--prompts", self.prompts, "--json"), "not finite")
        self.assert_refused(run("align", "--model", bad, "--recipe", "bf16", "--json"), "not finite")


# ---- --dry-run on the model commands ----------------------------------------------------------------

class DryRun(Case):
    def test_model_commands_validate_and_write_nothing(self):
        ids = self.path("ids.st")
        save_file({"ids": np.array([1, 5, 9], np.int32)}, ids)
        out = self.path("never.st")
        for args in (["forward", "--model", self.model, "--tokens", ids, "-o", out, "--recipe", "mxfp8"],
                     ["sample", "--model", self.model, "--prompts", self.prompts],
                     ["align", "--model", self.model, "--recipe", "nvfp4_per_token"]):
            with self.subTest(cmd=args[0]):
                p = run(*args, "--dry-run")
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertIn("dry run: nothing was run and nothing was created", p.stdout)
                self.assertIn("would run:", p.stdout)
                self.assertIn("resolved recipe", p.stdout)
        self.assertFalse(os.path.exists(out))
        # and they still validate: a token outside the vocabulary is an error in a dry run too
        bad = self.path("bad_ids.st")
        save_file({"ids": np.array([1, 5000], np.int32)}, bad)
        self.assert_refused(run("forward", "--model", self.model, "--tokens", bad, "-o", out, "--dry-run"),
                            "out of range")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_cli_values.py PATH_TO_lockstep [unittest args]")
    BIN = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
