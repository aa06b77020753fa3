#!/usr/bin/env python3
"""PyTorch baseline for `lockstep bench model`: lockstep's model presets built as transformers
models (Qwen3ForCausalLM / Qwen3MoeForCausalLM), fp32, eager execution (no torch.compile) on the
CPU with torch.set_num_threads(2), measuring

  learner: forward + backward tokens/s of a batch of 64 sequences of 12-24 tokens (the RL job's
           shape): logits -> per-token log-probs of the next tokens and entropies, backward of
           (sum of log-probs + sum of entropies); no optimizer step.
  decode:  batched incremental decoding with transformers' KV cache (DynamicCache): 64 prompts
           of 12-24 tokens, prefill, then 16 new tokens per sequence, each step one forward of
           [64, 1] tokens and a multinomial sample at temperature 1. decode tokens/s counts the
           64 x 16 new tokens over the 16 steps' time (prefill excluded; prefill tokens/s is
           reported beside it).

Fairness (transformers has no packed-sequence path on the CPU: its padding-free packing needs
flash-attention): the learner is measured two ways and the faster is the baseline:
  padded        one [64, 24] batch, right padding, attention mask, padded positions excluded
                from the objective (33 % of the compute is padding for lengths 12-24);
  per_sequence  64 calls of [1, len] (no padding compute, per-call overhead instead).
Only real tokens are counted. Decode uses left padding (as transformers' generation does) with
the attention mask; every sequence generates exactly 16 tokens (no eos), so no step is wasted.
Timings: warm-up runs, then the median of --repeats runs.

Presets come from `lockstep presets --json`, so both sides build the same configurations.
Writes JSON (--output, default bench/torch_baseline.json):
  {"schema": "lockstep.torch_baseline/1", "torch_version", "transformers_version", "threads",
   "attn_implementation", "cpu", "load_average_1min_at_start", "results": [{"preset", "learner_tokens_per_s",
   "decode_tokens_per_s", "learner_mode", "learner_padded_tokens_per_s",
   "learner_per_sequence_tokens_per_s", "prefill_tokens_per_s", "batch", "lengths", "new_tokens",
   "torch_version", "threads"}]}

Example: python3 bench/torch_baseline.py --lockstep build/lockstep
"""
import argparse
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time

try:
    import torch
    import transformers
    from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
except ImportError as e:
    sys.exit(f"torch_baseline: needs torch and transformers from PyPI ({e})")

BATCH, MIN_LEN, MAX_LEN, NEW_TOKENS = 64, 12, 24, 16


def build_model(config, attn):
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    if config["model_type"] == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**fields, attn_implementation=attn))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**fields, attn_implementation=attn))
    return model.float()


def objective(logits, targets, mask):
    """Sum over real tokens of the log-prob of the target and of the entropy (what lockstep's
    learner returns per token and backpropagates from)."""
    logp = torch.log_softmax(logits, dim=-1)
    tok = logp.gather(-1, targets[..., None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    return ((tok + ent) * mask).sum()


def time_median(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def learner_padded(model, seqs, vocab):
    n = len(seqs)
    ids = torch.zeros(n, MAX_LEN, dtype=torch.long)
    mask = torch.zeros(n, MAX_LEN)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    targets = torch.roll(ids, -1, dims=1) % vocab
    loss_mask = mask.clone()
    for i, s in enumerate(seqs):
        loss_mask[i, len(s) - 1] = 0  # the last real token has no target

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=mask.long()).logits
        objective(logits, targets, loss_mask).backward()

    return step


def learner_per_sequence(model, seqs, vocab):
    def step():
        model.zero_grad(set_to_none=True)
        for s in seqs:
            x = s[None]
            logits = model(input_ids=x).logits
            targets = torch.roll(x, -1, dims=1) % vocab
            m = torch.ones(1, len(s))
            m[0, -1] = 0
            objective(logits, targets, m).backward()

    return step


def decode(model, prompts, gen):
    n = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = p
        mask[i, width - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    times = {}
    # The KV-cache argument is `cache` in recent transformers, `past_key_values` before.
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def run():
        with torch.no_grad():
            cache = DynamicCache()
            t0 = time.perf_counter()
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                        **{cache_kw: cache})
            t1 = time.perf_counter()
            logits, m, pos = out.logits[:, -1], mask, positions[:, -1:]
            for _ in range(NEW_TOKENS):
                tok = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
                m = torch.cat([m, torch.ones(n, 1, dtype=torch.long)], dim=1)
                pos = pos + 1
                out = model(input_ids=tok, attention_mask=m, position_ids=pos, use_cache=True,
                            **{cache_kw: cache})
                logits = out.logits[:, -1]
            t2 = time.perf_counter()
        times.setdefault("prefill", []).append(t1 - t0)
        times.setdefault("decode", []).append(t2 - t1)

    return run, times


def bench_preset(name, config, args):
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = build_model(config, args.attn)
    vocab = config["vocab_size"]
    lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (BATCH,), generator=gen).tolist()
    seqs = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    real = sum(lengths)
    model.train()
    t_pad = time_median(learner_padded(model, seqs, vocab), args.warmup, args.repeats)
    t_seq = time_median(learner_per_sequence(model, seqs, vocab), args.warmup, args.repeats)
    model.eval()
    run, times = decode(model, seqs, gen)
    for _ in range(args.warmup):
        run()
    times.clear()
    for _ in range(args.repeats):
        run()
    t_dec, t_pre = statistics.median(times["decode"]), statistics.median(times["prefill"])
    pad_tps, seq_tps = real / t_pad, real / t_seq
    return {
        "preset": name,
        "learner_tokens_per_s": max(pad_tps, seq_tps),
        "decode_tokens_per_s": BATCH * NEW_TOKENS / t_dec,
        "learner_mode": "padded" if pad_tps >= seq_tps else "per_sequence",
        "learner_padded_tokens_per_s": pad_tps,
        "learner_per_sequence_tokens_per_s": seq_tps,
        "prefill_tokens_per_s": real / t_pre,
        "batch": BATCH,
        "lengths": lengths,
        "new_tokens": NEW_TOKENS,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example: python3 bench/torch_baseline.py --lockstep build/lockstep")
    ap.add_argument("--lockstep", default=os.environ.get("LOCKSTEP", os.path.join(root, "build", "lockstep")),
                    help="lockstep binary whose `presets --json` defines the models")
    ap.add_argument("--preset", action="append", help="preset name (repeatable; default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers attention implementation (both run in eager mode)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default=os.path.join(root, "bench", "torch_baseline.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_at_start = os.getloadavg()[0]  # other work on the machine makes the figures low
    r = subprocess.run([args.lockstep, "presets", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        ap.error(f"{args.lockstep} presets --json failed: {r.stderr.strip()}")
    presets = {p["name"]: p["config"] for p in json.loads(r.stdout)}
    names = args.preset or list(presets)
    for n in names:
        if n not in presets:
            ap.error(f"unknown preset {n}; presets: {', '.join(presets)}")
    results = [bench_preset(n, presets[n], args) for n in names]
    doc = {
        "schema": "lockstep.torch_baseline/1",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "threads": torch.get_num_threads(),
        "attn_implementation": args.attn,
        "cpu": platform.processor() or platform.machine(),
        "load_average_1min_at_start": load_at_start,
        "results": results,
    }
    tmp = args.output + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, args.output)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {doc['threads']} threads, "
          f"attention {args.attn}, fp32 eager, CPU")
    print(f"{'preset':<12} {'learner tok/s':>14} {'(padded':>9} {'per-seq)':>9} {'decode tok/s':>13} {'prefill tok/s':>14}")
    for x in results:
        print(f"{x['preset']:<12} {x['learner_tokens_per_s']:>14.0f} {x['learner_padded_tokens_per_s']:>9.0f} "
              f"{x['learner_per_sequence_tokens_per_s']:>9.0f} {x['decode_tokens_per_s']:>13.0f} "
              f"{x['prefill_tokens_per_s']:>14.0f}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
