"""End-to-end checks of `lockstep init` and `lockstep presets`: the model directory is read back
with Hugging Face's `safetensors` package and checked against tensor names and shapes computed
here from the config alone (transformers' Qwen3 / Qwen3-MoE naming), init statistics and
determinism, bf16 files as the RNE rounding of the f32 ones, shards and index, and every refusal
(exit 2, a message naming the problem, nothing written).

Run: python3 tests/py/test_model_init.py PATH_TO_lockstep_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit("usage: test_model_init.py PATH_TO_lockstep_BINARY [unittest args]")
LOCKSTEP = os.path.abspath(sys.argv.pop(1))

try:
    import numpy as np
    from safetensors import safe_open

    MISSING = None
except ImportError as e:  # CI installs both; a developer machine may not have them
    MISSING = f"needs the PyPI packages 'safetensors' and 'numpy' ({e})"


def run(*args, check=True):
    r = subprocess.run([LOCKSTEP, *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"lockstep {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def expected_hf_shapes(c):
    """HF tensor name -> shape for a Qwen3 / Qwen3-MoE config, written from transformers' module
    names (independent of lockstep's layout table)."""
    H, V, D = c["hidden_size"], c["vocab_size"], c["head_dim"]
    Hq, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    out = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = [V, H]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out[p + "input_layernorm.weight"] = [H]
        out[p + "post_attention_layernorm.weight"] = [H]
        out[p + "self_attn.q_proj.weight"] = [Hq * D, H]
        out[p + "self_attn.k_proj.weight"] = [Hkv * D, H]
        out[p + "self_attn.v_proj.weight"] = [Hkv * D, H]
        out[p + "self_attn.o_proj.weight"] = [H, Hq * D]
        out[p + "self_attn.q_norm.weight"] = [D]
        out[p + "self_attn.k_norm.weight"] = [D]
        moe = (
            c["model_type"] == "qwen3_moe"
            and l not in c.get("mlp_only_layers", [])
            and c.get("num_experts", 0) > 0
            and (l + 1) % c.get("decoder_sparse_step", 1) == 0
        )
        if moe:
            E, Ie = c["num_experts"], c["moe_intermediate_size"]
            out[p + "mlp.gate.weight"] = [E, H]
            for e in range(E):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = [Ie, H]
                out[p + f"mlp.experts.{e}.up_proj.weight"] = [Ie, H]
                out[p + f"mlp.experts.{e}.down_proj.weight"] = [H, Ie]
        else:
            I = c["intermediate_size"]
            out[p + "mlp.gate_proj.weight"] = [I, H]
            out[p + "mlp.up_proj.weight"] = [I, H]
            out[p + "mlp.down_proj.weight"] = [H, I]
    return out


def load_dir(d):
    """All tensors of a model directory (single file or index + shards) as numpy arrays, with the
    dtype name safetensors reports, plus the per-file metadata."""
    files = ["model.safetensors"]
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
    tensors, meta = {}, {}
    for name in files:
        with safe_open(os.path.join(d, name), "np") as f:
            meta[name] = f.metadata()
            for k in f.keys():
                sl = f.get_slice(k)
                tensors[k] = (sl.get_dtype(), f.get_tensor(k) if sl.get_dtype() != "BF16" else None)
    return tensors, meta, files


def raw_tensor_bytes(path):
    """name -> (dtype, shape, raw bytes) parsed straight from the safetensors layout."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n :]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in header.items()}


def bf16_rne(x):
    """float32 array -> bf16 bit patterns (uint16) by round-to-nearest-even."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


@unittest.skipIf(MISSING is not None, MISSING or "")
class Init(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="lockstep_init_")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_presets_listing(self):
        presets = json.loads(run("presets", "--json").stdout)
        names = [p["name"] for p in presets]
        self.assertEqual(names, ["tiny-dense", "tiny-moe", "gpu-moe", "qwen3-30b-a3b-4l"])
        for p in presets:
            shapes = expected_hf_shapes(p["config"])
            total = sum(int(np.prod(s)) for s in shapes.values())
            self.assertEqual(p["parameters"], total, p["name"])
        self.assertIn("tiny-moe", run("init", "--list-presets").stdout)

    def test_preset_files_match_transformers_names(self):
        for preset in ["tiny-dense", "tiny-moe"]:
            out = self.path(preset)
            run("init", "--preset", preset, "-o", out, "--seed", "11")
            self.assertEqual(sorted(os.listdir(out)), ["config.json", "model.safetensors", "run_meta.json"])
            with open(os.path.join(out, "config.json")) as f:
                config = json.load(f)
            expected = expected_hf_shapes(config)
            tensors, meta, _ = load_dir(out)
            self.assertEqual(set(tensors), set(expected), preset)
            for name, (dtype, arr) in tensors.items():
                self.assertEqual(dtype, "F32", name)
                self.assertEqual(list(arr.shape), expected[name], name)
                if arr.ndim == 1:
                    self.assertTrue(np.all(arr == 1.0), f"{name}: norms start at 1")
            big = np.concatenate([a.ravel() for d, a in tensors.values() if a.ndim == 2]).astype(np.float64)
            self.assertLess(abs(big.mean()), 6 * 0.02 / np.sqrt(big.size))
            self.assertLess(abs(big.std() - 0.02), 6 * 0.02 / np.sqrt(2 * big.size))
            self.assertLess(np.abs(big).max(), 0.02 * 6.67)
            self.assertEqual(meta["model.safetensors"]["format"], "pt")
            run_meta = json.loads(meta["model.safetensors"]["lockstep.run_meta"])
            self.assertEqual(run_meta["seeds"]["init"], 11)
            with open(os.path.join(out, "run_meta.json")) as f:
                self.assertEqual(json.load(f)["seeds"]["init"], 11)
            self.assertEqual(config["torch_dtype"], "float32")

    def test_deterministic_per_seed(self):
        for d, seed in [("a", "5"), ("b", "5"), ("c", "6")]:
            run("init", "--preset", "tiny-moe", "-o", self.path(d), "--seed", seed)
        a = raw_tensor_bytes(self.path("a/model.safetensors"))
        b = raw_tensor_bytes(self.path("b/model.safetensors"))
        c = raw_tensor_bytes(self.path("c/model.safetensors"))
        self.assertEqual(a, b)
        for name in a:
            if len(a[name][1]) == 2:
                self.assertNotEqual(a[name][2], c[name][2], name)

    def test_bf16_is_the_rounding_of_f32(self):
        run("init", "--preset", "tiny-moe", "-o", self.path("f32"), "--seed", "9")
        run("init", "--preset", "tiny-moe", "-o", self.path("bf16"), "--seed", "9", "--dtype", "bf16")
        f32 = raw_tensor_bytes(self.path("f32/model.safetensors"))
        bf16 = raw_tensor_bytes(self.path("bf16/model.safetensors"))
        self.assertEqual(set(f32), set(bf16))
        for name, (dtype, shape, raw) in bf16.items():
            self.assertEqual(dtype, "BF16")
            expect = bf16_rne(np.frombuffer(f32[name][2], dtype=np.float32)).tobytes()
            self.assertEqual(raw, expect, name)
        with open(self.path("bf16/config.json")) as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")

    def test_sharded(self):
        out = self.path("sharded")
        run("init", "--preset", "tiny-moe", "-o", out, "--max-shard-bytes", "200000")
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.assertNotIn("model.safetensors", os.listdir(out))
        tensors, _, files = load_dir(out)
        self.assertGreater(len(files), 1)
        self.assertEqual(set(index["weight_map"]), set(tensors))
        total = 0
        for name in files:
            raw = raw_tensor_bytes(os.path.join(out, name))
            size = sum(len(v[2]) for v in raw.values())
            self.assertTrue(size <= 200000 or len(raw) == 1, name)
            for t in raw:
                self.assertEqual(index["weight_map"][t], name)
            total += size
        self.assertEqual(index["metadata"]["total_size"], total)
        single = self.path("single")
        run("init", "--preset", "tiny-moe", "-o", single)
        ref = raw_tensor_bytes(os.path.join(single, "model.safetensors"))
        for name in files:
            for t, v in raw_tensor_bytes(os.path.join(out, name)).items():
                self.assertEqual(v, ref[t], t)

    def test_from_a_transformers_config(self):
        # Field set and values of what transformers 5 writes for a Qwen3 model: no head_dim given
        # to Qwen3Config means 128, rope_theta under rope_parameters.
        cfg = {
            "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": None, "dtype": "float32", "eos_token_id": None, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
            "intermediate_size": 96, "layer_types": ["full_attention"] * 2,
            "max_position_embeddings": 512, "max_window_layers": 28, "model_type": "qwen3",
            "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
            "pad_token_id": None, "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "sliding_window": None, "tie_word_embeddings": False, "transformers_version": "5.24.0",
            "use_cache": True, "use_sliding_window": False, "vocab_size": 48,
        }
        with open(self.path("config.json"), "w") as f:
            json.dump(cfg, f)
        out = self.path("model")
        run("init", "--config", self.path("config.json"), "-o", out, "--dtype", "bf16")
        with open(os.path.join(out, "config.json")) as f:
            written = json.load(f)
        for key in ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings"]:
            self.assertEqual(written[key], cfg[key], key)
        self.assertEqual(written["rope_theta"], 10000.0)
        tensors, _, _ = load_dir(out)
        self.assertEqual(set(tensors), set(expected_hf_shapes(written)))

    def test_refusals(self):
        def refused(args, *words):
            r = run(*args, check=False)
            self.assertEqual(r.returncode, 2, f"{args}: {r.stderr}")
            self.assertTrue(r.stderr.startswith("lockstep: error: "), r.stderr)
            for w in words:
                self.assertIn(w, r.stderr, args)
            return r

        out = self.path("m")
        run("init", "--preset", "tiny-dense", "-o", out)
        before = raw_tensor_bytes(os.path.join(out, "model.safetensors"))
        refused(["init", "--preset", "tiny-dense", "-o", out, "--seed", "3"], out, "--force")
        self.assertEqual(raw_tensor_bytes(os.path.join(out, "model.safetensors")), before)
        run("init", "--preset", "tiny-dense", "-o", out, "--seed", "3", "--force")
        self.assertNotEqual(raw_tensor_bytes(os.path.join(out, "model.safetensors")), before)

        refused(["init", "--preset", "tiny-dense", "--config", "x.json", "-o", self.path("n")], "exactly one")
        refused(["init", "--preset", "tiny-dense"], "-o")
        refused(["init", "--preset", "giant", "-o", self.path("n")], "giant", "tiny-moe")
        refused(["init", "--preset", "tiny-dense", "-o", self.path("n"), "--dtype", "f16"], "f16")
        with open(self.path("file"), "w") as f:
            f.write("x")
        refused(["init", "--preset", "tiny-dense", "-o", self.path("file")], "not a directory")
        bad = {"model_type": "qwen3", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 64,
               "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
               "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
        with open(self.path("bad.json"), "w") as f:
            json.dump(bad, f)
        refused(["init", "--config", self.path("bad.json"), "-o", self.path("n")], "bad.json", "rope_scaling")
        refused(["init", "--config", self.path("absent.json"), "-o", self.path("n")], "absent.json")
        self.assertFalse(os.path.exists(self.path("n")), "a refused init creates nothing")

    def test_dry_run_creates_nothing(self):
        r = run("init", "--preset", "tiny-moe", "-o", self.path("dry"), "--dry-run")
        self.assertIn("nothing was created", r.stdout)
        self.assertFalse(os.path.exists(self.path("dry")))


if __name__ == "__main__":
    unittest.main()
