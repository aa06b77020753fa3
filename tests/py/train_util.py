"""Shared by the train CLI tests: a micro Qwen3-MoE config (two layers, hidden 32; a run of a few
steps takes about a second) and small helpers for run folders."""
import hashlib
import json
import os
import signal
import subprocess
import time

# Keys that measure time (they differ between any two runs); every other key must be equal.
TIMING = ("time_", "elapsed_s", "tokens_per_s")


def run_lockstep(binary, *args, env=None, check=True, timeout=300):
    """binary ARGS...; an AssertionError with its stderr when check and it exits non-zero."""
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout, env=e)
    if check and r.returncode != 0:
        raise AssertionError(f"lockstep {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def micro_config(hidden=32, **changes):
    c = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 32,
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "moe_intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 32,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "torch_dtype": "float32",
    }
    c.update(changes)
    return c


def init_micro_model(binary, path, hidden=32, **changes):
    """`lockstep init` of micro_config(hidden, **changes) (written to PATH.json) into PATH, seed 3."""
    with open(path + ".json", "w") as f:
        json.dump(micro_config(hidden, **changes), f)
    run_lockstep(binary, "init", "--config", path + ".json", "-o", path, "--seed", "3")
    return path


def rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def load_json(path):
    with open(path) as f:
        return json.load(f)


def read_text(path):
    with open(path) as f:
        return f.read()


def untimed(rs):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rs]


def tree_digest(path):
    """name -> sha256 of every file under path (the state a refused command must leave alone)."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def checkpoint_digest(run_dir):
    """sha256 of the learner checkpoint's files (weights, AdamW moments, learner.json)."""
    out = {}
    for name in ("learner.safetensors", "learner.json"):
        with open(os.path.join(run_dir, "checkpoint", name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def kill_after_checkpoint(cmd, run_dir, step=2, timeout=120):
    """Starts cmd (a `lockstep train` writing run_dir), SIGKILLs it as soon as its checkpoint
    holds `step` or later (or when it ended, or after timeout seconds), and returns the exit
    status (-SIGKILL when it was killed while running)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = os.path.join(run_dir, "checkpoint", "trainer.json")
    deadline = time.time() + timeout
    while time.time() < deadline and p.poll() is None:
        try:
            if load_json(state)["step"] >= step:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.002)
    p.send_signal(signal.SIGKILL)
    p.wait()
    return p.returncode
