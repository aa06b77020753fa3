#!/usr/bin/env python3
"""Hugging Face compatibility of lockstep's model files and forward pass, against transformers.

(a) transformers -> lockstep: random tiny Qwen3 and Qwen3-MoE models are built with transformers
    (Qwen3Config / Qwen3ForCausalLM, Qwen3MoeConfig / Qwen3MoeForCausalLM; fp32 and bf16 files,
    tied and untied heads, single file and shards from save_pretrained(max_shard_size=...)), saved,
    and run by `lockstep forward --model DIR --tokens IDS.safetensors -o LOGITS.safetensors
    --recipe bf16` on a packed batch of sequences of different lengths (ids I32 [n], cu_seqlens
    I32 [b+1]). The reference is transformers in fp32 (eager attention) on the same stored
    weights, one sequence at a time.
    Before the forward, `lockstep inspect MODEL_DIR --json` must report the config transformers
    uses and every tensor of lockstep's fused layout with the checksum of the same tensor built
    here from the stored files (so the file reading and the fusion are checked without a forward).
(b) lockstep -> transformers: `lockstep init` writes models (presets and configs; f32 and bf16;
    tied and untied; single and sharded); transformers loads each with from_pretrained (no
    missing, unexpected or mis-shaped weights), re-saves it, the re-saved tensors must equal
    lockstep's bit for bit, and a forward runs (finite logits). With `lockstep forward` present,
    these models also go through the (a) comparison.

Criterion for (a), per model, with R the fp32 reference logits, L lockstep's (bf16 recipe) and
T transformers' own bf16 execution of the same files (dtype=torch.bfloat16), e_X(t) = max over
the vocabulary of |X - R| at token t:
    pass  <=>  max_t e_L(t) <= max_t e_T(t)  and  median_t e_L(t) <= median_t e_T(t)
i.e. lockstep's bf16 recipe (bf16 GEMM operands, fp32 accumulation, residuals and norms) is at
least as close to the fp32 reference as transformers running the model in bf16, whose every GEMM
input is rounded to bf16 too (unit roundoff u = 2^-8), both at its worst token and at its typical
one (the median is not moved by the few MoE tokens whose top-k routing flips between fp32 and
bf16, which dominate the max). The table also prints max|L - R| in units of u * max|R| (one bf16
rounding of the largest logit) for scale.

Runs on a GPU machine or on a CPU-only one (torch and transformers from PyPI). Prints one summary
table; exits 1 when any check fails (2 on bad usage).

Example: python3 scripts/hf-compat.py --lockstep build/lockstep
         python3 scripts/hf-compat.py --lockstep build/lockstep --skip-forward   # (b) only
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

try:
    import numpy as np
    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.numpy import save_file as np_save_file
    from transformers import (AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                              Qwen3MoeForCausalLM)
except ImportError as e:
    sys.exit(f"hf-compat: needs torch, transformers, safetensors and numpy from PyPI ({e})")

BF16_U = 2.0 ** -8
LENGTHS = [5, 17, 1, 32, 9]  # a packed batch of 64 tokens, positions restart per sequence


def base_dense(**kw):
    c = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
             rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False)
    c.update(kw)
    return c


def base_moe(**kw):
    c = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rope_theta=1e6, rms_norm_eps=1e-6, num_experts=8, num_experts_per_tok=2,
             moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
             mlp_only_layers=[], tie_word_embeddings=False)
    c.update(kw)
    return c


# (name, model class, config class, config kwargs, stored dtype, max_shard_size or None)
HF_CASES = [
    ("qwen3-f32-untied", Qwen3ForCausalLM, Qwen3Config, base_dense(), "float32", None),
    ("qwen3-bf16-tied-sharded", Qwen3ForCausalLM, Qwen3Config,
     base_dense(tie_word_embeddings=True, head_dim=16), "bfloat16", "40KB"),
    # config.json without head_dim: transformers' Qwen3 then uses 128 (not hidden / heads = 16).
    ("qwen3-f32-no-head-dim", Qwen3ForCausalLM, Qwen3Config,
     {k: v for k, v in base_dense(num_hidden_layers=1).items() if k != "head_dim"}, "float32", None),
    ("qwen3moe-f32-untied-sharded", Qwen3MoeForCausalLM, Qwen3MoeConfig, base_moe(), "float32",
     "60KB"),
    ("qwen3moe-bf16-tied-mixed", Qwen3MoeForCausalLM, Qwen3MoeConfig,
     base_moe(tie_word_embeddings=True, mlp_only_layers=[1], norm_topk_prob=False), "bfloat16", None),
    ("qwen3moe-bf16-untied-step2-sharded", Qwen3MoeForCausalLM, Qwen3MoeConfig,
     base_moe(decoder_sparse_step=2, head_dim=32), "bfloat16", "50KB"),
]

# (name, lockstep init arguments)
INIT_CASES = [
    ("init tiny-dense f32", ["--preset", "tiny-dense"]),
    ("init tiny-moe bf16 sharded", ["--preset", "tiny-moe", "--dtype", "bf16", "--max-shard-bytes", "100000"]),
    ("init qwen3 config untied", ["--config", "{qwen3_config}"]),
    ("init qwen3moe config tied mixed bf16", ["--config", "{moe_config}", "--dtype", "bf16"]),
]


class Check:
    """One row of the summary table."""

    def __init__(self, case, direction):
        self.case, self.direction = case, direction
        self.status, self.detail = "FAIL", ""

    def row(self):
        return [self.case, self.direction, self.status, self.detail]


def randomize(model, gen):
    """Every parameter random (the routers too: transformers starts them at zero, and equal router
    logits would make top-k a tie-break test): norms 1 + N(0, 0.2^2), embeddings N(0, 1), other
    matrices N(0, 1/fan_in) so activations and logits are of order 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[-1]))


def packed_tokens(vocab, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=sum(LENGTHS)).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)
    return ids, cu


def reference_logits(model_dir, ids, cu, dtype, device):
    """transformers' logits for each sequence alone (batch 1, no padding), concatenated."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    model.to(device).eval()
    out = []
    with torch.no_grad():
        for b in range(len(cu) - 1):
            x = torch.tensor(ids[cu[b]:cu[b + 1]], dtype=torch.long, device=device)[None]
            out.append(model(x).logits[0].float().cpu().numpy())
    return np.concatenate(out).astype(np.float64)


def lockstep_forward(lockstep, model_dir, ids, cu, work, recipe):
    tokens = os.path.join(work, "ids.safetensors")
    logits = os.path.join(work, "logits.safetensors")
    np_save_file({"ids": ids, "cu_seqlens": cu}, tokens)
    r = subprocess.run([lockstep, "forward", "--model", model_dir, "--tokens", tokens, "-o", logits,
                        "--recipe", recipe], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"lockstep forward exited {r.returncode}: {r.stderr.strip()}")
    with safe_open(logits, "np") as f:
        keys = list(f.keys())
        key = "logits" if "logits" in keys else keys[0]
        return f.get_tensor(key).astype(np.float64)


def compare_forward(check, lockstep, model_dir, vocab, work, args, seed):
    ids, cu = packed_tokens(vocab, seed)
    ref = reference_logits(model_dir, ids, cu, torch.float32, args.device)
    t_bf16 = reference_logits(model_dir, ids, cu, torch.bfloat16, args.device)
    mine = lockstep_forward(lockstep, model_dir, ids, cu, work, args.recipe)
    if mine.shape != ref.shape:
        check.detail = f"logits shape {mine.shape}, expected {ref.shape}"
        return
    # Per token: the largest |difference| over the vocabulary; then the max and the median over
    # tokens. The median is not moved by the few tokens whose MoE routing flips under bf16.
    err_tok = np.abs(mine - ref).max(axis=1)
    bound_tok = np.abs(t_bf16 - ref).max(axis=1)
    err, bound = err_tok.max(), bound_tok.max()
    err_med, bound_med = np.median(err_tok), np.median(bound_tok)
    scale = BF16_U * np.abs(ref).max()
    ok = bool(np.isfinite(mine).all() and err <= bound and err_med <= bound_med)
    check.status = "ok" if ok else "FAIL"
    check.detail = (f"max {err:.2e} {'<=' if err <= bound else '>'} {bound:.2e}, "
                    f"median {err_med:.2e} {'<=' if err_med <= bound_med else '>'} {bound_med:.2e} "
                    f"(lockstep vs transformers-bf16 error; max = {err / scale:.2f} u*max|R|)")


def f32_of(raw):
    """(dtype, shape, bytes) of a stored tensor -> float32 array (BF16 and F16 widened exactly)."""
    dtype, shape, data = raw
    if dtype == "F32":
        return np.frombuffer(data, dtype=np.float32).reshape(shape)
    if dtype == "BF16":
        return (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "F16":
        return np.frombuffer(data, dtype=np.float16).astype(np.float32).reshape(shape)
    raise ValueError(f"dtype {dtype}")


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def fused_layout(config, hf):
    """lockstep's fused tensors (docs/model.md, "Weights and files") built here from the HF
    tensors: name -> float32 array."""
    cat = lambda names: np.concatenate([f32_of(hf[n]) for n in names])
    out = {"embed": cat(["model.embed_tokens.weight"])}
    experts = getattr(config, "num_experts", 0) if config.model_type == "qwen3_moe" else 0
    for l in range(config.num_hidden_layers):
        p, q = f"layers.{l}.", f"model.layers.{l}."
        out[p + "input_norm"] = cat([q + "input_layernorm.weight"])
        out[p + "qkv"] = cat([q + f"self_attn.{x}_proj.weight" for x in "qkv"])
        out[p + "q_norm"] = cat([q + "self_attn.q_norm.weight"])
        out[p + "k_norm"] = cat([q + "self_attn.k_norm.weight"])
        out[p + "o_proj"] = cat([q + "self_attn.o_proj.weight"])
        out[p + "post_norm"] = cat([q + "post_attention_layernorm.weight"])
        moe = (experts > 0 and l not in (config.mlp_only_layers or [])
               and (l + 1) % config.decoder_sparse_step == 0)
        if moe:
            out[p + "router"] = cat([q + "mlp.gate.weight"])
            out[p + "experts_fc1"] = cat([q + f"mlp.experts.{e}.{x}_proj.weight"
                                          for e in range(experts) for x in ("gate", "up")])
            out[p + "experts_fc2"] = cat([q + f"mlp.experts.{e}.down_proj.weight" for e in range(experts)])
        else:
            out[p + "gate_up"] = cat([q + "mlp.gate_proj.weight", q + "mlp.up_proj.weight"])
            out[p + "down"] = cat([q + "mlp.down_proj.weight"])
    out["final_norm"] = cat(["model.norm.weight"])
    if not config.tie_word_embeddings:
        out["lm_head"] = cat(["lm_head.weight"])
    return out


def check_lockstep_reads(check, lockstep, model_dir, config):
    """`lockstep inspect MODEL_DIR --json` loads the directory; its config and every fused tensor's
    checksum must match what this script builds from the files transformers wrote."""
    r = subprocess.run([lockstep, "inspect", model_dir, "--json"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        check.detail = f"lockstep inspect exited {r.returncode}: {r.stderr.strip()}"
        return False
    info = json.loads(r.stdout)
    c = info["config"]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    expect = {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size, "head_dim": head_dim,
              "num_hidden_layers": config.num_hidden_layers,
              "num_attention_heads": config.num_attention_heads,
              "num_key_value_heads": config.num_key_value_heads,
              "tie_word_embeddings": config.tie_word_embeddings,
              "rope_theta": config.rope_parameters["rope_theta"], "rms_norm_eps": config.rms_norm_eps}
    if config.model_type == "qwen3_moe":
        expect.update(num_experts=config.num_experts, num_experts_per_tok=config.num_experts_per_tok,
                      moe_intermediate_size=config.moe_intermediate_size,
                      norm_topk_prob=config.norm_topk_prob, decoder_sparse_step=config.decoder_sparse_step,
                      mlp_only_layers=list(config.mlp_only_layers or []))
    wrong = {k: (c.get(k), v) for k, v in expect.items() if c.get(k) != v}
    if wrong:
        check.detail = f"config fields (lockstep, transformers) differ: {wrong}"
        return False
    fused = fused_layout(config, tensors_of(model_dir))
    got = {t["name"]: t for t in info["tensors"]}
    if set(got) != set(fused):
        check.detail = f"tensor sets differ: {sorted(set(got) ^ set(fused))[:4]}"
        return False
    for name, arr in fused.items():
        if got[name]["shape"] != list(arr.shape) or got[name]["fnv1a64"] != fnv1a64(arr.astype("<f4").tobytes()):
            check.detail = f"lockstep tensor {name} {got[name]['shape']} differs from the fused HF tensors {list(arr.shape)}"
            return False
    check.status = "ok"
    check.detail = f"lockstep reads config and {len(fused)} fused tensors (checksums equal)"
    return True


def hf_direction(args, work, rows):
    for i, (name, model_cls, config_cls, kw, dtype, shard) in enumerate(HF_CASES):
        files = Check(name, "transformers files -> lockstep")
        rows.append(files)
        try:
            gen = torch.Generator().manual_seed(args.seed + i)
            config = config_cls(**kw)
            model = model_cls(config).eval()
            randomize(model, gen)
            if dtype == "bfloat16":
                model = model.to(torch.bfloat16)
            d = os.path.join(work, name)
            model.save_pretrained(d, **({"max_shard_size": shard} if shard else {}))
            if "no-head-dim" in name:  # both readers must apply transformers' default
                with open(os.path.join(d, "config.json")) as f:
                    stored = json.load(f)
                del stored["head_dim"]
                with open(os.path.join(d, "config.json"), "w") as f:
                    json.dump(stored, f, indent=2)
            sharded = os.path.exists(os.path.join(d, "model.safetensors.index.json"))
            if bool(shard) != sharded:
                files.detail = f"save_pretrained sharding was {sharded}, expected {bool(shard)}"
                continue
            if not check_lockstep_reads(files, args.lockstep, d, model.config):
                continue
            fwd = Check(name, "transformers -> lockstep forward")
            rows.append(fwd)
            if args.skip_forward:
                fwd.status, fwd.detail = "skip", "--skip-forward"
                continue
            compare_forward(fwd, args.lockstep, d, kw["vocab_size"], work, args, args.seed + i)
        except Exception as e:  # a row per failure; the table still prints
            rows[-1].detail = f"{type(e).__name__}: {e}"
            if args.verbose:
                traceback.print_exc()


def tensors_of(model_dir):
    """name -> raw bytes, dtype, shape of every tensor of a model directory."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        header.pop("__metadata__", None)
        for k, v in header.items():
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], tuple(v["shape"]), data[8 + n + b:8 + n + e])
    return out


def init_direction(args, work, rows):
    configs = {
        "qwen3_config": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                             **base_dense(head_dim=24, vocab_size=80)),
        "moe_config": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
                           **base_moe(tie_word_embeddings=True, mlp_only_layers=[0])),
    }
    paths = {}
    for key, c in configs.items():
        paths[key] = os.path.join(work, f"{key}.json")
        with open(paths[key], "w") as f:
            json.dump(c, f)
    for i, (name, init_args) in enumerate(INIT_CASES):
        check = Check(name, "lockstep -> transformers")
        rows.append(check)
        try:
            d = os.path.join(work, "init-" + name.replace(" ", "-"))
            argv = [a.format(**paths) for a in init_args]
            r = subprocess.run([args.lockstep, "init", *argv, "-o", d, "--seed", str(args.seed + i)],
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                check.detail = f"lockstep init exited {r.returncode}: {r.stderr.strip()}"
                continue
            model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True,
                                                               attn_implementation="eager")
            problems = {k: v for k, v in info.items() if v and k != "error_msgs"} | (
                {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
            if problems:
                check.detail = f"from_pretrained: {problems}"
                continue
            resaved = os.path.join(d + "-resaved")
            model.save_pretrained(resaved)
            mine, theirs = tensors_of(d), tensors_of(resaved)
            if set(mine) != set(theirs):
                check.detail = (f"re-saved names differ: only lockstep {sorted(set(mine) - set(theirs))[:3]}, "
                                f"only transformers {sorted(set(theirs) - set(mine))[:3]}")
                continue
            differ = [k for k in mine if mine[k] != theirs[k]]
            if differ:
                check.detail = f"{len(differ)} tensors differ after the transformers round trip, e.g. {differ[0]}"
                continue
            vocab = model.config.vocab_size
            with torch.no_grad():
                logits = model(torch.tensor([[1, 5, 7, 2, 3]]) % vocab).logits
            if not torch.isfinite(logits).all() or tuple(logits.shape) != (1, 5, vocab):
                check.detail = f"forward gave {tuple(logits.shape)} with non-finite values"
                continue
            check.status = "ok"
            check.detail = f"{len(mine)} tensors loaded and re-saved bit-exact; forward finite"
            if not args.skip_forward:
                fwd = Check(name, "lockstep init -> both forwards")
                rows.append(fwd)
                try:
                    compare_forward(fwd, args.lockstep, d, vocab, work, args, args.seed + 100 + i)
                except Exception as e:
                    fwd.detail = f"{type(e).__name__}: {e}"
        except Exception as e:
            check.detail = f"{type(e).__name__}: {e}"
            if args.verbose:
                traceback.print_exc()


def print_table(rows):
    header = ["case", "direction", "result", "detail"]
    table = [header] + [r.row() for r in rows]
    widths = [max(len(str(r[i])) for r in table) for i in range(3)]
    for r in table:
        print("  ".join(str(r[i]).ljust(widths[i]) for i in range(3)) + "  " + str(r[3]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example: python3 scripts/hf-compat.py --lockstep build/lockstep")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--lockstep", default=os.environ.get("LOCKSTEP", os.path.join(root, "build", "lockstep")),
                    help="the lockstep binary (default: $LOCKSTEP or build/lockstep)")
    ap.add_argument("--recipe", default="bf16", help="recipe of lockstep forward (default bf16)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device of the transformers runs")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--skip-forward", action="store_true",
                    help="only the file checks (no lockstep forward comparison)")
    ap.add_argument("--workdir", help="keep the models here instead of a temporary folder")
    ap.add_argument("--json", help="also write the table as JSON to this file")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks")
    args = ap.parse_args()
    if not os.path.exists(args.lockstep):
        ap.error(f"no lockstep binary at {args.lockstep} (pass --lockstep PATH)")
    args.lockstep = os.path.abspath(args.lockstep)
    torch.manual_seed(args.seed)
    work = args.workdir or tempfile.mkdtemp(prefix="lockstep_hf_compat_")
    os.makedirs(work, exist_ok=True)
    rows = []
    try:
        hf_direction(args, work, rows)
        init_direction(args, work, rows)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"hf-compat: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"device {args.device}, recipe {args.recipe}, seed {args.seed}")
    print_table(rows)
    failed = [r for r in rows if r.status == "FAIL"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(zip(["case", "direction", "result", "detail"], r.row())) for r in rows], f, indent=2)
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
