#!/usr/bin/env python3
"""The compressed-tensors check of lockstep's export (docs/export.md), run where PyTorch is (the GPU
machine): it needs torch, transformers and the `compressed-tensors` package from PyPI.

1. Makes a bf16 Qwen3 model with lockstep (`lockstep init`) and exports it with an all-linear
   NVFP4 W4A16 recipe as `compressed-tensors-nvfp4`.
2. Loads the export with transformers + compressed-tensors (decompressed), and compares every
   decompressed weight with lockstep's dequantization of the same bytes ((e2m1 x e4m3) x S_dec,
   CONTRACT.md section 2): the count of differing values and the largest difference in ulps,
   against the rounding of compressed-tensors' own multiplication order
   (e2m1 x (e4m3 / global_scale)), computed here from the files.
3. Compares the logits of a packed batch: `lockstep forward` with the W4A16 recipe against
   transformers on the decompressed model in float32; passes when lockstep's difference from that
   reading is at most twice the difference bf16 arithmetic alone makes (transformers in bf16 vs
   float32): lockstep rounds activations to bf16 at each GEMM input, transformers-bf16 at every
   op, and each can sit one bf16 rounding scale from the float32 reading.
4. Quantizes the same bf16 weights with the compressed-tensors package itself (its global scale,
   block scales and packing; q / k / v and gate / up fused to one global scale as llm-compressor
   does) into a checkpoint, and runs `lockstep verify` on it: the measured differences are
   printed, not hidden.
5. Optionally (--moe) tries the same load on the tiny MoE preset (per-expert names).

Usage: python3 scripts/check-compressed-tensors.py PATH_TO_lockstep [--work DIR] [--json OUT]
Exit status 0 when steps 2 and 3 pass.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 128, "tie_word_embeddings": False,
    "bos_token_id": None, "eos_token_id": None,
}
RECIPE = {
    "name": "check_w4a16_all_linear", "extends": "w4a16_nvfp4",
    "fprop": {"weight": {"scaling": "per_tensor"}},
    "coverage": {"scope": "all_linear", "last_fraction_bf16": 0, "shared_experts_bf16": False},
}


def run(lockstep, *args):
    r = subprocess.run([lockstep, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"lockstep {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r.stdout


def read_safetensors(path):
    from safetensors.torch import load_file
    return load_file(path)


def load_dir_tensors(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx)
             else ["model.safetensors"])
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(d, f)))
    return out


def unpack(packed):
    p = packed.to(torch.int32)
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], -1)
    v = E2M1[codes & 0x7]
    return torch.where((codes & 0x8) != 0, -v, v)


def lockstep_dequant(t, prefix):
    """The contract's dequantization of an export's module: (e2m1 x e4m3) x S_dec in float32,
    S_dec = RN(1 / weight_global_scale)."""
    e = unpack(t[prefix + ".weight_packed"])
    s = t[prefix + ".weight_scale"].to(torch.float32).repeat_interleave(16, dim=1)
    s_dec = torch.tensor(1.0, dtype=torch.float32) / t[prefix + ".weight_global_scale"].float()
    return (e * s) * s_dec


def ct_order_dequant(t, prefix):
    """compressed-tensors' order: e2m1 x (e4m3 / weight_global_scale), float32."""
    e = unpack(t[prefix + ".weight_packed"])
    s = t[prefix + ".weight_scale"].to(torch.float32) / t[prefix + ".weight_global_scale"].float()
    return e * s.repeat_interleave(16, dim=1)


def ulps(a, b):
    ai = a.contiguous().view(torch.int32).to(torch.int64)
    bi = b.contiguous().view(torch.int32).to(torch.int64)
    return (ai - bi).abs()


def load_hf(path, dtype):
    from transformers import AutoModelForCausalLM
    kw = {"torch_dtype": dtype}
    try:
        from transformers import CompressedTensorsConfig
        kw["quantization_config"] = CompressedTensorsConfig(run_compressed=False)
    except ImportError:
        pass
    try:
        m = AutoModelForCausalLM.from_pretrained(path, **kw)
    except TypeError:
        kw["dtype"] = kw.pop("torch_dtype")
        m = AutoModelForCausalLM.from_pretrained(path, **kw)
    # compressed-tensors decompresses into bf16 whatever dtype the model was asked for: a float32
    # reading casts those (exact) bf16 weights up, so every op runs in float32.
    return m.to(dtype).eval()


def decompressed_weight(model, prefix):
    mod = model.get_submodule(prefix)
    w = getattr(mod, "weight", None)
    if w is None or not w.dtype.is_floating_point:
        raise RuntimeError(f"{prefix}: no decompressed float weight ({type(mod).__name__}); "
                           "transformers did not decompress the checkpoint")
    return w.detach().float().cpu()


def hf_logits(model, ids, cu):
    out = []
    with torch.no_grad():
        for s in range(len(cu) - 1):
            x = torch.tensor([ids[cu[s]:cu[s + 1]]], dtype=torch.long, device=model.device)
            out.append(model(input_ids=x).logits[0].float().cpu())
    return torch.cat(out)


def ct_quantize_module(w_bf16, global_scale):
    """compressed-tensors' own NVFP4 quantization of one weight with a given global scale."""
    from compressed_tensors.compressors import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    args = QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", group_size=16,
                            symmetric=True, dynamic=False, scale_dtype=torch.float8_e4m3fn)
    n, k = w_bf16.shape
    g = w_bf16.reshape(n, k // 16, 16)
    scale, _ = calculate_qparams(g.amin(dim=-1), g.amax(dim=-1), args, global_scale=global_scale)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    sd = NVFP4PackedCompressor.compress(
        {"weight": w_bf16, "weight_scale": scale, "weight_global_scale": global_scale}, scheme)
    return sd


def make_ct_checkpoint(src, export_dir, out_dir):
    """The bf16 weights quantized by compressed-tensors, in the export's module set and config."""
    from compressed_tensors.quantization.utils.helpers import generate_gparam
    from safetensors.torch import save_file
    exp = load_dir_tensors(export_dir)
    srct = load_dir_tensors(src)
    prefixes = sorted(n[: -len(".weight_packed")] for n in exp if n.endswith(".weight_packed"))
    # llm-compressor fuses the global scales of q / k / v and of gate / up (the smallest scale,
    # i.e. the largest amax, of the group).
    def fuse_key(p):
        parent, leaf = p.rsplit(".", 1)
        if leaf in ("q_proj", "k_proj", "v_proj"):
            return parent + ".qkv"
        if leaf in ("gate_proj", "up_proj"):
            return parent + ".gate_up"
        return p
    gscale = {}
    for p in prefixes:
        w = srct[p + ".weight"]
        gscale[p] = generate_gparam(w.amin(), w.amax())
    fused = {}
    for p in prefixes:
        k = fuse_key(p)
        fused[k] = gscale[p] if k not in fused else torch.minimum(fused[k], gscale[p])
    out = {}
    for n, t in srct.items():
        if n.endswith(".weight") and n[: -len(".weight")] in gscale:
            p = n[: -len(".weight")]
            sd = ct_quantize_module(t, fused[fuse_key(p)])
            for key in ("weight_packed", "weight_scale", "weight_global_scale"):
                # Fused modules share one global scale tensor: each file entry gets its own copy.
                out[f"{p}.{key}"] = sd[key].contiguous().clone()
        else:
            out[n] = t
    os.makedirs(out_dir)
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lockstep")
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--moe", action="store_true", help="also try the tiny MoE preset")
    a = ap.parse_args()
    lockstep = os.path.abspath(a.lockstep)
    work = a.work or tempfile.mkdtemp(prefix="ct_check_")
    os.makedirs(work, exist_ok=True)
    import compressed_tensors
    import transformers
    report = {"torch": torch.__version__, "transformers": transformers.__version__,
              "compressed_tensors": compressed_tensors.__version__}
    print("versions:", report, flush=True)

    cfg_path = os.path.join(work, "config_in.json")
    json.dump(CONFIG, open(cfg_path, "w"))
    recipe_path = os.path.join(work, "w4a16_all.json")
    json.dump(RECIPE, open(recipe_path, "w"))
    src, exp = os.path.join(work, "bf16"), os.path.join(work, "ct_export")
    for d in (src, exp):
        if os.path.exists(d):
            sys.exit(f"{d} exists; give an empty --work folder")
    run(lockstep, "init", "--config", cfg_path, "-o", src, "--dtype", "bf16", "--seed", "7")
    run(lockstep, "export", "--model", src, "--recipe-file", recipe_path, "--format",
        "compressed-tensors-nvfp4", "-o", exp)

    # 2. Weights.
    t = load_dir_tensors(exp)
    m32 = load_hf(exp, torch.float32)
    prefixes = sorted(n[: -len(".weight_packed")] for n in t if n.endswith(".weight_packed"))
    w = {"modules": len(prefixes), "values": 0, "differ_f32": 0, "differ_bf16": 0,
         "max_ulps_f32": 0, "ct_order_differ_f32": 0, "ct_order_max_ulps": 0,
         "unexplained": 0}
    for p in prefixes:
        got = decompressed_weight(m32, p)          # what transformers + compressed-tensors give
        mine = lockstep_dequant(t, p)              # lockstep's values
        ct = ct_order_dequant(t, p)                # compressed-tensors' order, from the files
        w["values"] += got.numel()
        w["differ_bf16"] += int((got != mine.to(torch.bfloat16).float()).sum())
        w["differ_f32"] += int((got != mine).sum())
        w["max_ulps_f32"] = max(w["max_ulps_f32"], int(ulps(got, mine).max()))
        w["ct_order_differ_f32"] += int((ct != mine).sum())
        w["ct_order_max_ulps"] = max(w["ct_order_max_ulps"], int(ulps(ct, mine).max()))
        # Every difference is the package's own rounding: the decompressed weight is its order's
        # value, in float32 or rounded to bf16.
        w["unexplained"] += int(((got != ct) & (got != ct.to(torch.bfloat16).float())).sum())
    report["weights"] = w
    print("weights:", w, flush=True)
    ok_weights = w["unexplained"] == 0 and w["ct_order_max_ulps"] <= 2

    # 3. Logits of a packed batch.
    lens = [5, 11, 8]
    rng = np.random.default_rng(3)
    ids = [int(v) for v in rng.integers(0, CONFIG["vocab_size"], sum(lens))]
    cu = [0] + list(np.cumsum(lens))
    from safetensors.torch import save_file
    tok = os.path.join(work, "tokens.safetensors")
    save_file({"ids": torch.tensor(ids, dtype=torch.int32),
               "cu_seqlens": torch.tensor(cu, dtype=torch.int64)}, tok)
    lg = os.path.join(work, "logits.safetensors")
    run(lockstep, "forward", "--model", src, "--recipe-file", recipe_path, "--tokens", tok, "-o",
        lg, "--deterministic")
    l_lock = read_safetensors(lg)["logits"].float()
    l32 = hf_logits(m32, ids, cu)
    del m32
    m16 = load_hf(exp, torch.bfloat16)
    l16 = hf_logits(m16, ids, cu)
    d_lock = float((l_lock - l32).abs().max())
    d_bf16 = float((l16 - l32).abs().max())
    report["logits"] = {"tokens": len(ids), "max_abs_logit": float(l32.abs().max()),
                        "lockstep_vs_hf_fp32": d_lock, "hf_bf16_vs_hf_fp32": d_bf16,
                        "bound": 2 * d_bf16}
    print("logits:", report["logits"], flush=True)
    ok_logits = d_lock <= 2 * d_bf16

    # 4. verify on compressed-tensors' own quantization of the same weights.
    ctq = os.path.join(work, "ct_tool")
    make_ct_checkpoint(src, exp, ctq)
    v = json.loads(run(lockstep, "verify", src, ctq, "--json"))
    report["verify_compressed_tensors"] = {k: v[k] for k in (
        "format", "modules", "identical_modules", "data_bytes_differ", "scale_bytes_differ",
        "global_scales_differ", "by_class")}
    report["verify_compressed_tensors"]["per_module"] = [
        {k: m[k] for k in ("module", "domain", "data_bytes_differ", "scale_bytes_differ",
                           "by_class", "global_scale")} for m in v["per_module"]]
    print("verify (compressed-tensors' quantization):",
          json.dumps(report["verify_compressed_tensors"], indent=1)[:4000], flush=True)
    try:
        mct = load_hf(ctq, torch.float32)
        report["ct_tool_loads_in_transformers"] = True
        del mct
    except Exception as e:  # noqa: BLE001 (reported, not fatal)
        report["ct_tool_loads_in_transformers"] = f"{type(e).__name__}: {e}"

    # 5. MoE (per-expert names), reported.
    if a.moe:
        msrc, mexp = os.path.join(work, "moe_bf16"), os.path.join(work, "moe_ct")
        run(lockstep, "init", "--preset", "tiny-moe", "-o", msrc, "--dtype", "bf16")
        run(lockstep, "export", "--model", msrc, "--recipe", "nvfp4_per_token_w_per_tensor",
            "--weights-only", "--format", "compressed-tensors-nvfp4", "-o", mexp)
        try:
            mm = load_hf(mexp, torch.float32)
            mt = load_dir_tensors(mexp)
            p = sorted(n[: -len(".weight_packed")] for n in mt if n.endswith(".weight_packed"))[0]
            report["moe"] = {"loaded": True, "first_module": p}
            try:
                got = decompressed_weight(mm, p)
                report["moe"]["first_module_differ_bf16"] = int(
                    (got != lockstep_dequant(mt, p).to(torch.bfloat16).float()).sum())
            except Exception as e:  # noqa: BLE001
                report["moe"]["first_module"] = f"{p}: {type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001
            report["moe"] = {"loaded": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        print("moe:", report["moe"], flush=True)

    report["pass"] = {"weights": ok_weights, "logits": ok_logits}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    print("PASS" if ok_weights and ok_logits else "FAIL", report["pass"])
    sys.exit(0 if ok_weights and ok_logits else 1)


if __name__ == "__main__":
    main()
