"""End-to-end checks of `lockstep export` and `lockstep convert` against readers written from each
format's published description (hf_reader.py) and the NumPy contract reference (contract_ref.py),
neither of which uses lockstep's code:

- modelopt-nvfp4, compressed-tensors-nvfp4, mxfp8 and fp8-block exports hold, byte for byte, the
  contract's quantization of the source weights in each format's names, dtypes, shapes, nibble
  order and scale conventions; gate / up (and fused q / k / v) share one global scale;
- `export --model` and the streamed `convert` write the same tensors, sharded or not;
- each format's reader dequantizes to the contract's values up to its own multiplication order
  (measured and printed: the figures docs/export.md quotes);
- bad input exits 2 with a message naming the problem and leaves nothing behind, also when
  writing fails half way.

Run: python3 tests/py/test_export.py PATH_TO_lockstep_BINARY
"""
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import unittest

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contract_ref as ref  # noqa: E402
import hf_reader as hf  # noqa: E402
from st_files import raw_file, read_st  # noqa: E402

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_export.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))

FORMATS = ("modelopt-nvfp4", "compressed-tensors-nvfp4", "mxfp8", "fp8-block")


def run(*args, check=True, **kw):
    r = subprocess.run([LOCKSTEP, *args], capture_output=True, text=True, timeout=600, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"lockstep {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


# All-linear NVFP4 W4A16 with per-tensor 16x16-block weights: q / k / v, o_proj and the experts
# quantized (the built-in NVFP4 recipes cover the experts only).
ALL_LINEAR = {
    "name": "test_all_linear",
    "extends": "w4a16_nvfp4",
    "fprop": {"weight": {"scaling": "per_tensor", "block2d": True}},
    "coverage": {"scope": "all_linear", "last_fraction_bf16": 0, "shared_experts_bf16": False},
}


class Fixture:
    """Models made once: tiny-moe and tiny-dense in bf16, and a sharded copy of tiny-moe."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.tmp.name
        self.moe = os.path.join(d, "moe")
        self.dense = os.path.join(d, "dense")
        self.moe_sharded = os.path.join(d, "moe_sharded")
        run("init", "--preset", "tiny-moe", "-o", self.moe, "--dtype", "bf16", "--seed", "5")
        run("init", "--preset", "tiny-dense", "-o", self.dense, "--dtype", "bf16", "--seed", "6")
        run("init", "--preset", "tiny-moe", "-o", self.moe_sharded, "--dtype", "bf16", "--seed",
            "5", "--max-shard-bytes", "200000")
        for m in (self.moe, self.moe_sharded):
            with open(os.path.join(m, "tokenizer_config.json"), "w") as f:
                f.write('{"model_max_length": 256}\n')
        self.recipe_file = os.path.join(d, "all_linear.json")
        with open(self.recipe_file, "w") as f:
            json.dump(ALL_LINEAR, f)
        self.n = 0

    def out(self, tag):
        self.n += 1
        return os.path.join(self.tmp.name, f"out{self.n}_{tag}")


FIX = None


def setUpModule():
    global FIX
    FIX = Fixture()


def tearDownModule():
    FIX.tmp.cleanup()


# The lockstep tensor (one outer domain for NVFP4, one 128x128 tile grid for fp8-block) each
# Hugging Face module belongs to, and the order of its members.
def fused_key(prefix, per_group_experts):
    parts = prefix.split(".")
    layer = parts[2] if parts[0] == "model" and parts[1] == "layers" else "-"
    leaf = parts[-1]
    if leaf in ("q_proj", "k_proj", "v_proj"):
        return f"{layer}.qkv"
    if "experts" in parts:
        e = parts[parts.index("experts") + 1]
        kind = "fc1" if leaf in ("gate_proj", "up_proj") else "fc2"
        return f"{layer}.{kind}.{e}" if per_group_experts else f"{layer}.{kind}"
    if leaf in ("gate_proj", "up_proj"):
        return f"{layer}.gate_up"
    return prefix


def member_order(prefix):
    parts = prefix.split(".")
    e = int(parts[parts.index("experts") + 1]) if "experts" in parts else 0
    leaf = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1}.get(parts[-1], 0)
    return (e, leaf)


def groups(prefixes, per_group_experts):
    g = {}
    for p in prefixes:
        g.setdefault(fused_key(p, per_group_experts), []).append(p)
    return {k: sorted(v, key=member_order) for k, v in g.items()}


def ulps(a, b):
    a = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    b = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    return np.abs(a - b)


MEASURED = {}


class ExportFormats(unittest.TestCase):
    def export_both(self, model, recipe_args, fmt, extra=()):
        """export --model and convert of the same model; returns the export's folder."""
        a, b = FIX.out(fmt), FIX.out(fmt + "_conv")
        run("export", "--model", model, *recipe_args, "--format", fmt, "-o", a, *extra)
        run("convert", model, *recipe_args, "--format", fmt, "-o", b, *extra)
        ta, _, ca, ha, _ = hf.load_dir(a)
        tb, _, cb, hb, _ = hf.load_dir(b)
        self.assertEqual(sorted(ta), sorted(tb))
        for n in ta:
            self.assertEqual(ta[n].tobytes(), tb[n].tobytes(), f"{fmt}: {n} export vs convert")
        self.assertEqual(ca["quantization_config"], cb["quantization_config"])
        self.assertEqual(ha, hb)
        return a

    def check_nvfp4(self, src, out, fmt, per_group_experts, block2d, input_amax=None):
        t, dt, cfg, hq, _ = hf.load_dir(out)
        s, _, _, _, _ = hf.load_dir(src)
        qc = cfg["quantization_config"]
        prefixes = hf.quantized_prefixes(t, dt, fmt)
        self.assertTrue(prefixes)
        if fmt == "modelopt-nvfp4":
            algo = "NVFP4" if input_amax else "W4A16_NVFP4"
            self.assertEqual(hq["quantization"]["quant_algo"], algo)
            self.assertEqual(hq["quantization"]["group_size"], 16)
            self.assertIn("kv_cache_quant_algo", hq["quantization"])
            self.assertEqual(qc["quant_method"], "modelopt")
            self.assertEqual(qc["quant_algo"], algo)
            excluded = hq["quantization"]["exclude_modules"]
            self.assertEqual(excluded, qc["ignore"])
        else:
            self.assertEqual(qc["quant_method"], "compressed-tensors")
            self.assertEqual(qc["format"], "nvfp4-pack-quantized")
            g = qc["config_groups"]["group_0"]
            self.assertEqual((g["weights"]["num_bits"], g["weights"]["type"],
                              g["weights"]["strategy"], g["weights"]["group_size"]),
                             (4, "float", "tensor_group", 16))
            self.assertEqual(g["input_activations"] is not None, input_amax is not None)
            excluded = qc["ignore"]
        for p in prefixes:
            self.assertNotIn(p, excluded)
        stats = {"elements": 0, "modelopt_order": 0, "ct_order": 0, "max_ulps": 0,
                 "modelopt_order_bf16": 0, "ct_order_bf16": 0}
        for key, members in groups(prefixes, per_group_experts).items():
            x = np.concatenate([s[m + ".weight"].astype(np.float32) for m in members], axis=0)
            want = ref.nvfp4_quantize(x, "per_tensor", block2d=block2d)
            s_enc = ref.nvfp4_s_enc(want["amax"])
            s_dec = np.float32(1.0) / s_enc
            r0 = 0
            globals_seen = set()
            for m in members:
                n = s[m + ".weight"].shape[0]
                codes, scale, g, data, sc = hf.nvfp4_module(t, m, fmt)
                self.assertEqual(data.tobytes(), want["qdata"][r0:r0 + n].tobytes(), m)
                self.assertEqual(sc.view(np.uint8).tobytes(),
                                 want["block_scale"][r0:r0 + n].tobytes(), m)
                expect_g = s_dec if fmt == "modelopt-nvfp4" else s_enc
                self.assertEqual(np.float32(g).view(np.uint32), np.float32(expect_g).view(np.uint32),
                                 f"{m}: global scale {g} vs the contract's {expect_g}")
                globals_seen.add(np.float32(g).tobytes())
                if input_amax is not None:
                    s_in = ref.nvfp4_s_enc(np.float32(input_amax))
                    name = ".input_scale" if fmt == "modelopt-nvfp4" else ".input_global_scale"
                    want_in = np.float32(1.0) / s_in if fmt == "modelopt-nvfp4" else s_in
                    self.assertEqual(np.float32(t[m + name].reshape(())), np.float32(want_in), m)
                # The readers' values against the contract's dequantization.
                contract = ref.nvfp4_dequantize(want["qdata"][r0:r0 + n],
                                                want["block_scale"][r0:r0 + n], want["amax"])
                inner = hf.dequant_inner_first(codes, scale, s_dec)
                self.assertEqual(inner.tobytes(), contract.tobytes(), m)
                mo = hf.dequant_modelopt(codes, scale, s_dec)
                ct = hf.dequant_ct(codes, scale, s_enc)
                bf = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
                stats["elements"] += contract.size
                stats["modelopt_order"] += int(np.sum(mo != contract))
                stats["ct_order"] += int(np.sum(ct != contract))
                stats["modelopt_order_bf16"] += int(np.sum(bf(mo) != bf(contract)))
                stats["ct_order_bf16"] += int(np.sum(bf(ct) != bf(contract)))
                stats["max_ulps"] = int(max(stats["max_ulps"], ulps(mo, contract).max(),
                                            ulps(ct, contract).max()))
                r0 += n
            # One global scale per fused group (gate / up of an expert, q / k / v).
            self.assertEqual(len(globals_seen), 1, f"{key}: {len(globals_seen)} global scales")
        # Each reading differs from the contract's only in the last place.
        self.assertLessEqual(stats["max_ulps"], 2, stats)
        return stats, excluded

    def test_nvfp4_experts_per_group(self):
        for fmt in ("modelopt-nvfp4", "compressed-tensors-nvfp4"):
            out = self.export_both(FIX.moe, ["--recipe", "nvfp4_per_token_w_per_tensor"], fmt,
                                   ["--weights-only"])
            stats, excluded = self.check_nvfp4(FIX.moe, out, fmt, per_group_experts=True,
                                               block2d=False)
            MEASURED[fmt] = stats
            # Attention, routers, the head and the bf16 tail layer are listed, not quantized.
            for m in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.gate", "lm_head",
                      "model.layers.3.mlp.experts", "model.layers.3.mlp.experts.7.down_proj"):
                self.assertIn(m, excluded, fmt)
            t, dt, _, _, files = hf.load_dir(out)
            s, _, _, _, _ = hf.load_dir(FIX.moe)
            for n in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight",
                      "model.norm.weight", "model.layers.3.mlp.experts.2.up_proj.weight"):
                self.assertEqual(dt[n], "BF16")
                self.assertEqual(t[n].tobytes(), s[n].tobytes(), n)
            self.assertTrue(os.path.exists(os.path.join(out, "tokenizer_config.json")))

    def test_nvfp4_all_linear_fused_qkv_and_w4a4(self):
        for model in (FIX.moe, FIX.dense):
            for fmt in ("modelopt-nvfp4", "compressed-tensors-nvfp4"):
                out = self.export_both(model, ["--recipe-file", FIX.recipe_file], fmt)
                self.check_nvfp4(model, out, fmt, per_group_experts=False, block2d=True)
        # W4A4: nvfp4_block quantizes activations per tensor; the static scale comes from
        # --input-amax.
        for fmt in ("modelopt-nvfp4", "compressed-tensors-nvfp4"):
            out = self.export_both(FIX.moe, ["--recipe", "nvfp4_block"], fmt,
                                   ["--input-amax", "8.5"])
            self.check_nvfp4(FIX.moe, out, fmt, per_group_experts=True, block2d=True,
                             input_amax=8.5)

    def test_separate_qkv_scales(self):
        out = FIX.out("sep")
        run("export", "--model", FIX.moe, "--recipe-file", FIX.recipe_file, "--format",
            "modelopt-nvfp4", "--no-fuse-scales", "-o", out)
        t, dt, _, _, _ = hf.load_dir(out)
        s, _, _, _, _ = hf.load_dir(FIX.moe)
        gs = set()
        for p in ("q_proj", "k_proj", "v_proj"):
            m = f"model.layers.1.self_attn.{p}"
            want = ref.nvfp4_quantize(s[m + ".weight"].astype(np.float32), "per_tensor",
                                      block2d=True)
            self.assertEqual(t[m + ".weight"].tobytes(), want["qdata"].tobytes(), m)
            g = np.float32(t[m + ".weight_scale_2"].reshape(()))
            self.assertEqual(g, np.float32(1.0) / ref.nvfp4_s_enc(want["amax"]), m)
            gs.add(g.tobytes())
        self.assertEqual(len(gs), 3)

    def test_mxfp8(self):
        out = self.export_both(FIX.moe, ["--recipe", "mxfp8"], "mxfp8")
        t, dt, cfg, hq, _ = hf.load_dir(out)
        s, _, _, _, _ = hf.load_dir(FIX.moe)
        self.assertEqual(hq["quantization"]["quant_algo"], "MXFP8")
        self.assertIn("model.layers.0.mlp.gate", hq["quantization"]["exclude_modules"])
        prefixes = hf.quantized_prefixes(t, dt, "mxfp8")
        self.assertIn("model.layers.2.self_attn.k_proj", prefixes)
        n = 0
        for m in prefixes:
            want = ref.mxfp8_quantize(s[m + ".weight"].astype(np.float32))
            self.assertEqual(dt[m + ".weight_scale"], "U8")
            self.assertEqual(t[m + ".weight"].view(np.uint8).tobytes(), want["qdata"].tobytes(), m)
            self.assertEqual(t[m + ".weight_scale"].tobytes(), want["block_scale"].tobytes(), m)
            got = hf.dequant_mxfp8(t[m + ".weight"], t[m + ".weight_scale"])
            contract = ref.mxfp8_dequantize(want["qdata"], want["block_scale"])
            self.assertEqual(got.tobytes(), contract.tobytes(), m)
            n += got.size
        MEASURED["mxfp8"] = {"elements": n, "reader_differs": 0}

    def test_fp8_block(self):
        out = self.export_both(FIX.moe, ["--recipe", "fp8_block"], "fp8-block")
        t, dt, cfg, _, _ = hf.load_dir(out)
        s, _, _, _, _ = hf.load_dir(FIX.moe)
        qc = cfg["quantization_config"]
        self.assertEqual((qc["quant_method"], qc["weight_block_size"], qc["activation_scheme"]),
                         ("fp8", [128, 128], "dynamic"))
        prefixes = hf.quantized_prefixes(t, dt, "fp8-block")
        n = 0
        for key, members in groups(prefixes, per_group_experts=True).items():
            x = np.concatenate([s[m + ".weight"].astype(np.float32) for m in members], axis=0)
            want = ref.fp8_quantize(x, "block_128x128", pow2=True, input_is_bf16=False)
            r0 = 0
            for m in members:
                rows = s[m + ".weight"].shape[0]
                self.assertEqual(t[m + ".weight"].view(np.uint8).tobytes(),
                                 want["qdata"][r0:r0 + rows].tobytes(), m)
                inv = t[m + ".weight_scale_inv"]
                tiles = [(r0 + 128 * i) // 128 for i in range(inv.shape[0])]
                self.assertEqual(inv.tobytes(), want["scale_inv"][tiles].tobytes(), m)
                got = hf.dequant_fp8_block(t[m + ".weight"], inv)
                contract = ref.fp8_dequantize(want["qdata"][r0:r0 + rows],
                                              want["scale_inv"], "block_128x128")
                self.assertEqual(got.tobytes(), contract.tobytes(), m)
                n += got.size
                r0 += rows
        MEASURED["fp8-block"] = {"elements": n, "reader_differs": 0}

    def test_sharded_input_and_output(self):
        a, b = FIX.out("sharded_a"), FIX.out("sharded_b")
        run("convert", FIX.moe_sharded, "--recipe", "mxfp8", "--format", "mxfp8", "-o", a,
            "--max-shard-bytes", "150000")
        run("export", "--model", FIX.moe, "--recipe", "mxfp8", "--format", "mxfp8", "-o", b)
        ta, _, _, _, files = hf.load_dir(a)
        tb, _, _, _, _ = hf.load_dir(b)
        self.assertGreater(len(files), 1)
        with open(os.path.join(a, "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.assertEqual(sorted(index["weight_map"]), sorted(ta))
        for n in tb:
            self.assertEqual(ta[n].tobytes(), tb[n].tobytes(), n)
        self.assertTrue(os.path.exists(os.path.join(a, "tokenizer_config.json")))


class Runs(unittest.TestCase):
    """`export --run`: the checkpoint's version (default) or the reference (version 0), with the
    run's own recipe."""

    def test_export_a_run(self):
        run_dir = FIX.out("run")
        # A random tiny model earns no reward, so its gradient is 0; weight decay still moves the
        # weights from one version to the next.
        run("train", "--model", FIX.moe, "--out", run_dir, "--recipe",
            "nvfp4_per_token_w_per_tensor", "--steps", "2", "--prompts", "4", "--group", "2",
            "--max-new", "4", "--eval-prompts", "4", "--eval-every", "2", "--checkpoint-every",
            "2", "--difficulty", "1", "--lr", "0.01", "--weight-decay", "0.5")
        with open(os.path.join(run_dir, "checkpoint", "trainer.json")) as f:
            version = json.load(f)["policy_version"]
        self.assertGreater(version, 0)
        out = FIX.out("run_latest")
        r = run("export", "--run", run_dir, "--format", "modelopt-nvfp4", "--weights-only", "-o",
                out, "--json")
        self.assertEqual(json.loads(r.stdout)["version"], version)
        _, meta = read_st(os.path.join(out, "model.safetensors"))
        self.assertEqual(meta["lockstep.policy_version"], str(version))
        self.assertEqual(meta["lockstep.recipe"], "nvfp4_per_token_w_per_tensor")
        self.assertEqual(len(meta["lockstep.checksum"]), 16)
        self.assertEqual(meta["lockstep.checksum_version"], "2")
        # Version 0 is the run's reference: the same bytes as exporting that model directly.
        v0, ref = FIX.out("run_v0"), FIX.out("run_ref")
        run("export", "--run", run_dir, "--version", "0", "--format", "modelopt-nvfp4",
            "--weights-only", "-o", v0)
        run("export", "--model", os.path.join(run_dir, "reference"), "--recipe",
            "nvfp4_per_token_w_per_tensor", "--format", "modelopt-nvfp4", "--weights-only", "-o",
            ref)
        a, _, _, _, _ = hf.load_dir(v0)
        b, _, _, _, _ = hf.load_dir(ref)
        latest, _, _, _, _ = hf.load_dir(out)
        self.assertEqual(sorted(a), sorted(b))
        for n in a:
            self.assertEqual(a[n].tobytes(), b[n].tobytes(), n)
        moved = [n for n in a if a[n].tobytes() != latest[n].tobytes()]
        self.assertTrue(moved, "the trained version equals the reference")
        bad = FIX.out("run_bad")
        r = run("export", "--run", run_dir, "--version", "99", "--format", "modelopt-nvfp4",
                "--weights-only", "-o", bad, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("no version 99", r.stderr)
        r = run("export", "--run", run_dir, "--recipe", "mxfp8", "--format", "mxfp8", "-o", bad,
                check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("a run brings its recipe", r.stderr)
        self.assertFalse(os.path.exists(bad))


def leftovers(parent, name):
    return [e for e in os.listdir(parent) if e == name or e.startswith("." + name + ".tmp")]


class BadInput(unittest.TestCase):
    def expect_refused(self, args, *needles, out=None):
        r = run(*args, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertTrue(r.stderr.startswith("lockstep: error: "), r.stderr)
        for n in needles:
            self.assertIn(n, r.stderr)
        if out:
            self.assertEqual(leftovers(os.path.dirname(out), os.path.basename(out)), [])
        return r.stderr

    def test_unknown_format(self):
        out = FIX.out("bad")
        self.expect_refused(["export", "--model", FIX.moe, "--recipe", "mxfp8", "--format",
                             "gguf", "-o", out], "unknown format 'gguf'", "modelopt-nvfp4",
                            out=out)

    def test_recipe_the_format_cannot_express(self):
        out = FIX.out("bad")
        self.expect_refused(["convert", FIX.moe, "--recipe", "nvfp4_per_token", "--format",
                             "modelopt-nvfp4", "--weights-only", "-o", out],
                            "layers.0.experts_fc1", "per-row", out=out)
        self.expect_refused(["export", "--model", FIX.moe, "--recipe", "mxfp8", "--format",
                             "fp8-block", "-o", out], "layers.0.qkv", "mxfp8", out=out)
        self.expect_refused(["export", "--model", FIX.moe, "--recipe",
                             "nvfp4_per_token_w_per_tensor", "--format", "modelopt-nvfp4",
                             "-o", out], "--input-amax", out=out)

    def test_model_without_the_tensors(self):
        d = FIX.out("missing")
        os.makedirs(d)
        raw, meta = read_st(os.path.join(FIX.moe, "model.safetensors"))
        header, blobs, off = {"__metadata__": meta}, [], 0
        for name, (dtype, shape, b) in raw.items():
            if name == "model.layers.1.mlp.experts.5.up_proj.weight":
                continue
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(raw_file(header, b"".join(blobs)))
        with open(os.path.join(FIX.moe, "config.json")) as f, \
                open(os.path.join(d, "config.json"), "w") as g:
            g.write(f.read())
        out = FIX.out("bad")
        self.expect_refused(["convert", d, "--recipe", "mxfp8", "--format", "mxfp8", "-o", out],
                            "model.layers.1.mlp.experts.5.up_proj.weight", out=out)
        self.expect_refused(["export", "--model", d, "--recipe", "mxfp8", "--format", "mxfp8",
                             "-o", out], "model.layers.1.mlp.experts.5.up_proj.weight", out=out)

    def test_output_folder_exists(self):
        out = FIX.out("exists")
        os.makedirs(out)
        with open(os.path.join(out, "keep.txt"), "w") as f:
            f.write("mine\n")
        for cmd in (["convert", FIX.moe], ["export", "--model", FIX.moe]):
            self.expect_refused(cmd + ["--recipe", "mxfp8", "--format", "mxfp8", "-o", out],
                                "exists")
        self.assertEqual(os.listdir(out), ["keep.txt"])

    def test_failure_half_way_leaves_nothing(self):
        # A file size limit stops the shard writes after the first bytes (EFBIG): the export must
        # fail and leave neither OUT_DIR nor its temporary folder.
        out = FIX.out("efbig")

        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (60000, 60000))

        r = run("convert", FIX.moe, "--recipe", "mxfp8", "--format", "mxfp8", "-o", out,
                check=False, preexec_fn=limit)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("lockstep:", r.stderr)
        self.assertEqual(leftovers(os.path.dirname(out), os.path.basename(out)), [])


class Verify(unittest.TestCase):
    def verify(self, quant, *extra, code=0):
        r = run("verify", FIX.moe, quant, "--json", *extra, check=False)
        self.assertEqual(r.returncode, code, r.stderr)
        return json.loads(r.stdout)

    def test_lockstep_exports_verify_identical(self):
        cases = [("modelopt-nvfp4", ["--recipe", "nvfp4_per_token_w_per_tensor", "--weights-only"]),
                 ("compressed-tensors-nvfp4", ["--recipe-file", FIX.recipe_file]),
                 ("mxfp8", ["--recipe", "mxfp8"]),
                 ("fp8-block", ["--recipe", "fp8_block"])]
        for fmt, args in cases:
            out = FIX.out("v_" + fmt)
            run("export", "--model", FIX.moe, *args, "--format", fmt, "-o", out)
            j = self.verify(out, "--strict")
            self.assertEqual(j["format"], fmt)
            self.assertTrue(j["identical"], json.dumps(j)[:2000])
            self.assertGreater(j["modules"], 0)
            if fmt == "compressed-tensors-nvfp4":
                q = [m for m in j["per_module"] if m["module"].endswith("self_attn.k_proj")]
                self.assertTrue(q and q[0]["domain"].startswith("joint"), q)

    def test_planted_differences_are_classified(self):
        out = FIX.out("v_plant")
        run("export", "--model", FIX.moe, "--recipe", "nvfp4_per_token_w_per_tensor",
            "--weights-only", "--format", "modelopt-nvfp4", "-o", out)
        path = os.path.join(out, "model.safetensors")
        raw, meta = read_st(path)
        tensors = {k: bytearray(v[2]) for k, v in raw.items()}
        # 1. nibble order: swap the two codes of every byte of one module.
        a = "model.layers.1.mlp.experts.2.down_proj.weight"
        tensors[a] = bytearray(((b >> 4) | (b << 4)) & 0xFF for b in tensors[a])
        # 2. one block scale one code up (and so its elements follow).
        b = "model.layers.0.mlp.experts.0.gate_proj.weight_scale"
        tensors[b][5] = tensors[b][5] - 1 if tensors[b][5] > 1 else tensors[b][5] + 1
        # 3. one element code changed far from any tie: 0 -> 6 (code 7) where the code is 0.
        c = "model.layers.2.mlp.experts.4.up_proj.weight"
        i = next(j for j, v in enumerate(tensors[c]) if v & 0x0F == 0)
        tensors[c][i] = (tensors[c][i] & 0xF0) | 0x7
        header, blobs, off = {"__metadata__": meta}, [], 0
        for k, (dtype, shape, _) in raw.items():
            bb = bytes(tensors[k])
            header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(bb)]}
            blobs.append(bb)
            off += len(bb)
        with open(path, "wb") as f:
            f.write(raw_file(header, b"".join(blobs)))
        j = self.verify(out, "--strict", code=1)
        mods = {m["module"]: m for m in j["per_module"]}
        ma = mods[a[: -len(".weight")]]
        self.assertGreater(ma["elements_differ"], 0)
        self.assertEqual(ma["by_class"]["nibble_order"], ma["elements_differ"])
        mb = mods["model.layers.0.mlp.experts.0.gate_proj"]
        self.assertEqual(mb["scale_bytes_differ"], 1)
        self.assertEqual(mb["by_class"]["scale_rounding"],
                         1 + mb["elements_differ"], mb)
        mc = mods[c[: -len(".weight")]]
        self.assertEqual((mc["elements_differ"], mc["by_class"]["other"]), (1, 1), mc)
        self.assertEqual(j["identical_modules"], j["modules"] - 3)

    def test_tie_and_amax_floor(self):
        # A model whose expert weight has an exact tie and a zero block, quantized by lockstep;
        # the file then takes the other rounding of the tie and a floored scale of the zero block.
        d = FIX.out("tie_model")
        os.makedirs(d)
        raw, meta = read_st(os.path.join(FIX.moe, "model.safetensors"))
        name = "model.layers.0.mlp.experts.1.down_proj.weight"
        w = np.frombuffer(raw[name][2], dtype=ml_dtypes.bfloat16).reshape(raw[name][1]).copy()
        w[1, 0] = np.float32(2688.0)          # the tensor amax: S_enc = 1, S_dec = 1
        w[2, 0:16] = 0                         # a zero block: the contract's scale is 0
        w[3, 0] = np.float32(6.0)              # block amax 6: scale 1, encode factor 1
        w[3, 1] = np.float32(2.5)              # an exact tie between codes 2 and 3 -> 2 (even)
        raw[name] = (raw[name][0], raw[name][1], w.tobytes())
        header, blobs, off = {"__metadata__": meta}, [], 0
        for k, (dtype, shape, bb) in raw.items():
            header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(bb)]}
            blobs.append(bb)
            off += len(bb)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(raw_file(header, b"".join(blobs)))
        with open(os.path.join(FIX.moe, "config.json")) as f, \
                open(os.path.join(d, "config.json"), "w") as g:
            g.write(f.read())
        out = FIX.out("tie_out")
        run("export", "--model", d, "--recipe", "nvfp4_per_token_w_per_tensor", "--weights-only",
            "--format", "compressed-tensors-nvfp4", "-o", out)
        path = os.path.join(out, "model.safetensors")
        raw2, meta2 = read_st(path)
        p = "model.layers.0.mlp.experts.1.down_proj"
        data = bytearray(raw2[p + ".weight_packed"][2])
        scale = bytearray(raw2[p + ".weight_scale"][2])
        cols = 64
        self.assertEqual(data[3 * cols // 2] >> 4, 0x4, "the contract rounds 2.5 to 2 (code 4)")
        data[3 * cols // 2] = (data[3 * cols // 2] & 0x0F) | (0x5 << 4)  # 3.0: ties away
        self.assertEqual(scale[2 * (cols // 16)], 0)
        scale[2 * (cols // 16)] = 0x20  # 0.125, compressed-tensors' floor for a zero block
        raw2[p + ".weight_packed"] = (raw2[p + ".weight_packed"][0], raw2[p + ".weight_packed"][1],
                                      bytes(data))
        raw2[p + ".weight_scale"] = (raw2[p + ".weight_scale"][0], raw2[p + ".weight_scale"][1],
                                     bytes(scale))
        header, blobs, off = {"__metadata__": meta2}, [], 0
        for k, (dtype, shape, bb) in raw2.items():
            header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(bb)]}
            blobs.append(bb)
            off += len(bb)
        with open(path, "wb") as f:
            f.write(raw_file(header, b"".join(blobs)))
        r = run("verify", d, out, "--json", check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(r.stdout)
        m = {x["module"]: x for x in j["per_module"]}[p]
        self.assertEqual(m["by_class"]["tie_rounding"], 1, m)
        self.assertEqual(m["by_class"]["amax_floor"], 1, m)
        self.assertEqual((m["elements_differ"], m["scale_bytes_differ"]), (1, 1), m)

    def test_not_a_quantized_checkpoint(self):
        r = run("verify", FIX.moe, FIX.dense, check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("quantization_config", r.stderr)


class ZMeasured(unittest.TestCase):
    def test_print_measured(self):
        # The reader-vs-contract figures of this run (docs/export.md quotes them).
        print("\nreader vs lockstep dequantization:", json.dumps(MEASURED, sort_keys=True),
              file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
