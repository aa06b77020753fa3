"""End-to-end tests of `lockstep recipes`, `describe` and `doctor`: coverage on 20 and 48 layers,
selection precedence through flags and environment, conflicts and unknown names (exit 2), a
recipe-file round trip for every built-in, and DISABLE_BACKWARD_QUANT.

Usage: python3 test_recipe_cli.py PATH_TO_lockstep
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

LOCKSTEP = None
FORMATS = {"bf16", "fp8", "mxfp8", "nvfp4"}
MODES = {"quantized", "high_precision", "dequantized"}
MODULES = ["qkv", "attn_out", "router", "experts_fc1", "experts_fc2", "shared_fc1", "shared_fc2"]
NVFP4_RECIPES = ["nvfp4_per_token", "nvfp4_per_token_bf16_bwd", "nvfp4_per_token_dequant_bwd",
                 "nvfp4_per_token_w_per_tensor", "nvfp4_per_tensor", "nvfp4_block", "w4a16_nvfp4",
                 "w4a8_nvfp4_mxfp8"]


def run(*args, env=None):
    e = {k: v for k, v in os.environ.items()
         if k not in ("LOCKSTEP_RECIPE", "DISABLE_BACKWARD_QUANT")}
    e.update(env or {})
    return subprocess.run([LOCKSTEP, *args], capture_output=True, text=True, env=e, timeout=120)


def describe(*args, env=None):
    p = run("describe", *args, "--json", env=env)
    assert p.returncode == 0, f"describe {args} failed: {p.stderr}"
    return json.loads(p.stdout)


class RecipeCli(unittest.TestCase):
    def test_recipes_lists_every_builtin(self):
        p = run("recipes", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = json.loads(p.stdout)
        names = [r["name"] for r in rows]
        self.assertEqual(len(names), 12)
        for n in ["bf16", "fp8_per_tensor", "fp8_block", "mxfp8", *NVFP4_RECIPES]:
            self.assertIn(n, names)
        for r in rows:
            for key in ("purpose", "forward", "backward", "requires"):
                self.assertTrue(r[key], f"{r['name']} has no {key}")
        text = run("recipes")
        self.assertEqual(text.returncode, 0)
        for n in names:
            self.assertIn(n, text.stdout)

    def test_describe_schema_every_recipe(self):
        names = [r["name"] for r in json.loads(run("recipes", "--json").stdout)]
        for name in names:
            for layers in (20, 48):
                d = describe(name, "--layers", str(layers))
                self.assertEqual(d["recipe"], name)
                self.assertEqual(set(d), {"recipe", "layers", "lm_head"})
                self.assertEqual([l["layer"] for l in d["layers"]], list(range(layers)))
                for l in d["layers"]:
                    self.assertEqual(list(l["modules"]), MODULES)
                    for m in [*l["modules"].values(), d["lm_head"]]:
                        self.assertEqual(set(m), {"fprop", "dgrad", "wgrad", "backward_mode"})
                        self.assertIn(m["fprop"], FORMATS)
                        self.assertIn(m["dgrad"], FORMATS)
                        self.assertIn(m["wgrad"], FORMATS)
                        self.assertIn(m["backward_mode"], MODES)
                    # Router and LM head stay bf16 in every built-in.
                    self.assertEqual(l["modules"]["router"]["fprop"], "bf16")
                self.assertEqual(d["lm_head"]["fprop"], "bf16")

    def test_nvfp4_recipes_keep_last_15_percent_bf16(self):
        for name in NVFP4_RECIPES:
            for layers, tail in ((20, 3), (48, 8)):
                self.assertEqual(tail, math.ceil(round(0.15 * layers, 9)))
                d = describe(name, "--layers", str(layers))
                for l in d["layers"]:
                    i, mods = l["layer"], l["modules"]
                    expect = "bf16" if i >= layers - tail else "nvfp4"
                    for cls in ("experts_fc1", "experts_fc2"):
                        self.assertEqual(mods[cls]["fprop"], expect, f"{name} L{layers} layer {i} {cls}")
                    for cls in ("qkv", "attn_out", "router", "shared_fc1", "shared_fc2"):
                        self.assertEqual(mods[cls], {"fprop": "bf16", "dgrad": "bf16", "wgrad": "bf16",
                                                     "backward_mode": "high_precision"})

    def test_nvfp4_per_token_backward_modes(self):
        expert = describe("nvfp4_per_token", "--layers", "20")["layers"][0]["modules"]["experts_fc1"]
        self.assertEqual(expert, {"fprop": "nvfp4", "dgrad": "mxfp8", "wgrad": "mxfp8",
                                  "backward_mode": "quantized"})
        hp = describe("nvfp4_per_token_bf16_bwd", "--layers", "20")["layers"][0]["modules"]["experts_fc2"]
        self.assertEqual(hp, {"fprop": "nvfp4", "dgrad": "bf16", "wgrad": "bf16",
                              "backward_mode": "high_precision"})
        dq = describe("nvfp4_per_token_dequant_bwd", "--layers", "20")["layers"][0]["modules"]["experts_fc2"]
        self.assertEqual(dq["backward_mode"], "dequantized")
        blk = describe("nvfp4_block", "--layers", "20")["layers"][0]["modules"]["experts_fc1"]
        self.assertEqual([blk["fprop"], blk["dgrad"], blk["wgrad"]], ["nvfp4"] * 3)

    def test_all_linear_recipes_cover_attention(self):
        for name, fmt in (("fp8_per_tensor", "fp8"), ("fp8_block", "fp8"), ("mxfp8", "mxfp8")):
            d = describe(name, "--layers", "20")
            for l in d["layers"]:
                for cls in ("qkv", "attn_out", "experts_fc1", "experts_fc2", "shared_fc1", "shared_fc2"):
                    self.assertEqual(l["modules"][cls]["fprop"], fmt, f"{name} {cls}")

    def test_precedence(self):
        self.assertEqual(describe("--layers", "4")["recipe"], "bf16")  # default
        env = {"LOCKSTEP_RECIPE": "fp8_block"}
        self.assertEqual(describe("--layers", "4", env=env)["recipe"], "fp8_block")
        self.assertEqual(describe("--recipe", "mxfp8", "--layers", "4", env=env)["recipe"], "mxfp8")
        self.assertEqual(describe("mxfp8", "--layers", "4", env=env)["recipe"], "mxfp8")
        with tempfile.TemporaryDirectory() as tmp:
            f = os.path.join(tmp, "mine.json")
            with open(f, "w") as fh:
                json.dump({"extends": "nvfp4_per_token", "coverage": {"last_fraction_bf16": 0.5}}, fh)
            d = describe("--recipe-file", f, "--layers", "20", env=env)
            self.assertEqual(d["recipe"], "mine")
            q = [l["modules"]["experts_fc1"]["fprop"] for l in d["layers"]]
            self.assertEqual(q, ["nvfp4"] * 10 + ["bf16"] * 10)
            text = run("describe", "--recipe-file", f, "--layers", "20", env=env)
            self.assertIn("LOCKSTEP_RECIPE=fp8_block ignored", text.stdout)

    def test_conflict_and_unknown_names_exit_2(self):
        with tempfile.TemporaryDirectory() as tmp:
            f = os.path.join(tmp, "r.json")
            with open(f, "w") as fh:
                fh.write('{"name": "r"}')
            p = run("describe", "--recipe", "mxfp8", "--recipe-file", f)
            self.assertEqual(p.returncode, 2)
            self.assertIn("lockstep: error:", p.stderr)
            self.assertIn("--recipe-file", p.stderr)
        p = run("describe", "nvfp4_per_tokn")
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown recipe 'nvfp4_per_tokn'", p.stderr)
        self.assertIn("closest: nvfp4_per_token", p.stderr)
        p = run("describe", env={"LOCKSTEP_RECIPE": "fp8_blok"})
        self.assertEqual(p.returncode, 2)
        self.assertIn("LOCKSTEP_RECIPE=fp8_blok", p.stderr)
        self.assertIn("closest: fp8_block", p.stderr)
        p = run("doctor", "--recipe", "nope")
        self.assertEqual(p.returncode, 2)
        p = run("describe", "bf16", "--layers", "0")
        self.assertEqual(p.returncode, 2)

    def test_every_builtin_round_trips_through_a_file(self):
        rows = json.loads(run("recipes", "--json").stdout)
        with tempfile.TemporaryDirectory() as tmp:
            for r in rows:
                f = os.path.join(tmp, r["name"] + ".json")
                with open(f, "w") as fh:
                    json.dump(r["recipe"], fh, indent=2)
                for layers in ("20", "48"):
                    self.assertEqual(describe("--recipe-file", f, "--layers", layers),
                                     describe(r["name"], "--layers", layers), r["name"])

    def test_bad_recipe_file_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            f = os.path.join(tmp, "bad.json")
            with open(f, "w") as fh:
                json.dump({"extends": "mxfp8", "fprop": {"weight": {"format": "nvfp4", "scaling": "block_1x32"}}}, fh)
            p = run("describe", "--recipe-file", f)
            self.assertEqual(p.returncode, 2)
            self.assertIn("fprop.weight: nvfp4 takes scaling", p.stderr)

    def test_disable_backward_quant(self):
        env = {"DISABLE_BACKWARD_QUANT": "1"}
        d = describe("nvfp4_per_token", "--layers", "20", env=env)
        e = d["layers"][0]["modules"]["experts_fc1"]
        self.assertEqual(e, {"fprop": "nvfp4", "dgrad": "bf16", "wgrad": "bf16",
                             "backward_mode": "high_precision"})
        text = run("describe", "nvfp4_per_token", "--layers", "20", env=env)
        self.assertIn("DISABLE_BACKWARD_QUANT=1 (alias of backward_mode high_precision)", text.stdout)
        p = run("describe", "nvfp4_per_token", env={"DISABLE_BACKWARD_QUANT": "yes"})
        self.assertEqual(p.returncode, 2)
        self.assertIn("expected 0 or 1", p.stderr)

    def test_doctor(self):
        p = run("doctor", "--recipe", "nvfp4_block", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        d = json.loads(p.stdout)
        self.assertEqual(d["recipe"]["name"], "nvfp4_block")
        self.assertTrue(d["recipe"]["runs_on_cpu"])
        ids = [r["id"] for r in d["recipe"]["requires"]]
        self.assertIn("round:stochastic", ids)
        self.assertIn("cpu", d)
        self.assertIn("build", d)
        p = run("doctor")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("recipe: bf16 (from default", p.stdout)


if __name__ == "__main__":
    LOCKSTEP = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
