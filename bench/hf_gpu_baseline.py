#!/usr/bin/env python3
"""GPU baseline for `lockstep bench model --device cuda`: a lockstep preset built as a transformers
Qwen3-MoE (or Qwen3) model in bf16 on one CUDA device, with random weights, measuring

  learner: forward + backward tokens/s of a packed batch of `--tokens` tokens made of equal-length
           sequences of `--seq-len` tokens ([tokens / seq_len, seq_len] input, no padding, SDPA
           causal attention): logits -> log-softmax in fp32 -> per-token log-probs of the next
           tokens and entropies, backward of (sum of log-probs + sum of entropies); no optimizer
           step. MFU = 6 x active parameters x tokens / s over `--peak-tflops` (the bf16 matrix
           rate measured beside it when --peak-tflops is 0).
  decode:  `generate` with the static KV cache (cache_implementation="static"), greedy, `--prompt`
           prompt tokens and `--new` new tokens per sequence (no eos), at each batch of --batches;
           decode tokens/s = batch x new tokens / (generate time - prefill time), the prefill
           timed by a generate call with max_new_tokens=1.
  memory:  peak allocated bytes of each measurement (torch.cuda.max_memory_allocated).

The MoE experts run transformers' "grouped_mm" backend when the installed transformers offers it
(the `experts_implementation` the JSON records). Timings: CUDA-synchronised wall time, warm-up
runs, then the median of --repeats runs.

Presets come from `lockstep presets --json`, so both sides build the same configuration.
Writes JSON (--output): {"schema": "lockstep.hf_gpu_baseline/1", "torch_version",
"transformers_version", "device", "preset", "experts_implementation", "learner": [{"tokens",
"seq_len", "tokens_per_s", "seconds", "peak_bytes", "mfu"}], "decode": [{"batch", "prompt",
"new_tokens", "tokens_per_s", "step_ms", "peak_bytes"}], "matmul_tflops"}.

Example: python3 bench/hf_gpu_baseline.py --lockstep build/lockstep --preset qwen3-30b-a3b-4l
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

try:
    import torch
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
except ImportError as e:
    sys.exit(f"hf_gpu_baseline: needs torch and transformers ({e})")


def preset_config(lockstep, name):
    out = subprocess.run([lockstep, "presets", "--json"], check=True, capture_output=True, text=True)
    for p in json.loads(out.stdout):
        if p["name"] == name:
            return p["config"]
    sys.exit(f"hf_gpu_baseline: no preset {name!r} in `lockstep presets --json`")


def build_model(cfg, device):
    fields = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype", "dtype")}
    moe = cfg.get("model_type") == "qwen3_moe"
    config = (Qwen3MoeConfig if moe else Qwen3Config)(**fields)
    config._attn_implementation = "sdpa"
    impl = "eager"
    if moe:
        try:
            config._experts_implementation = "grouped_mm"
            impl = "grouped_mm"
        except Exception:  # an older transformers without the experts interface
            impl = "eager"
    cls = Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(config).to(torch.bfloat16)
    model.eval()
    return model, impl


def active_params(cfg):
    H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    D, hq, hkv = cfg.get("head_dim", H // cfg["num_attention_heads"]), cfg["num_attention_heads"], cfg["num_key_value_heads"]
    attn = H * (hq + 2 * hkv) * D + hq * D * H
    if cfg.get("model_type") == "qwen3_moe":
        mlp = cfg["num_experts_per_tok"] * 3 * H * cfg["moe_intermediate_size"] + H * cfg["num_experts"]
    else:
        mlp = 3 * H * cfg["intermediate_size"]
    return L * (attn + mlp) + V * H  # embedding lookups are not matrix work; the LM head is


def timed(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_tflops(device):
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    s = timed(lambda: a @ b, 3, 10)
    return 2 * 8192**3 / s / 1e12


def learner_step(model, ids):
    logits = model(input_ids=ids).logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1)
    tgt = ids[:, 1:]
    logp = lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    ent = -(lp.exp() * lp).sum(-1)
    (logp.sum() + ent.sum()).backward()
    model.zero_grad(set_to_none=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lockstep", default="build/lockstep")
    ap.add_argument("--preset", default="qwen3-30b-a3b-4l")
    ap.add_argument("--tokens", type=int, nargs="*", default=[16384],
                    help="learner batch sizes in tokens (none: decode only)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--output", default="hf_gpu_baseline.json")
    a = ap.parse_args()
    device = torch.device("cuda")
    cfg = preset_config(a.lockstep, a.preset)
    model, impl = build_model(cfg, device)
    peak = a.peak_tflops or matmul_tflops(device)
    res = {"schema": "lockstep.hf_gpu_baseline/1", "torch_version": torch.__version__,
           "transformers_version": transformers.__version__, "device": torch.cuda.get_device_name(),
           "preset": a.preset, "experts_implementation": impl, "matmul_tflops": peak,
           "learner": [], "decode": []}
    n_act = active_params(cfg)
    gen = torch.Generator(device=device).manual_seed(1)
    model.train()
    for tokens in a.tokens:
        b = max(1, tokens // a.seq_len)
        ids = torch.randint(0, cfg["vocab_size"], (b, a.seq_len), device=device, generator=gen)
        torch.cuda.reset_peak_memory_stats()
        try:
            s = timed(lambda: learner_step(model, ids), 2, a.repeats)
        except torch.OutOfMemoryError:
            res["learner"].append({"tokens": b * a.seq_len, "seq_len": a.seq_len, "error": "out of memory"})
            torch.cuda.empty_cache()
            continue
        n = b * a.seq_len
        res["learner"].append({"tokens": n, "seq_len": a.seq_len, "tokens_per_s": n / s, "seconds": s,
                               "peak_bytes": torch.cuda.max_memory_allocated(),
                               "mfu": 6 * n_act * n / s / (peak * 1e12)})
        print(f"learner {n} tokens: {n / s:,.0f} tokens/s", flush=True)
    model.eval()
    for batch in a.batches:
        ids = torch.randint(0, cfg["vocab_size"], (batch, a.prompt), device=device, generator=gen)
        mask = torch.ones_like(ids)
        kw = dict(attention_mask=mask, do_sample=False, cache_implementation="static",
                  pad_token_id=0, eos_token_id=None)
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            t_full = timed(lambda: model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, **kw), 1, 3)
            t_pre = timed(lambda: model.generate(ids, max_new_tokens=1, **kw), 1, 3)
        decode = max(t_full - t_pre, 1e-9)
        res["decode"].append({"batch": batch, "prompt": a.prompt, "new_tokens": a.new,
                              "tokens_per_s": batch * (a.new - 1) / decode,
                              "step_ms": 1e3 * decode / (a.new - 1),
                              "peak_bytes": torch.cuda.max_memory_allocated()})
        print(f"decode batch {batch}: {batch * (a.new - 1) / decode:,.0f} tokens/s", flush=True)
    with open(a.output, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
