"""Model and sampler handles (docs/model.md): load or make a Qwen3 / Qwen3-MoE model, the learner's
log-probs of packed sequences (to compare with another engine on the same tokens), the sampler,
policy versions, and one GRPO step driven from Python (`rl_step`), composed of the same calls the
`lockstep train` loop makes.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _arrays, _lockstep
from .recipes import Recipe, as_recipe
from .rl import align_stats, grpo_advantages, objective


class Model:
    """A model's config and F32 master weights in lockstep's layout (docs/model.md)."""

    __slots__ = ("_w",)

    def __init__(self, handle: "_lockstep.ModelWeights"):
        self._w = handle

    @staticmethod
    def load(path: str) -> "Model":
        """A model directory: config.json + model.safetensors (or an index with shards)."""
        return Model(_lockstep.ModelWeights.load(str(path)))

    @staticmethod
    def init(preset: Optional[str] = None, config: Optional[Dict[str, Any]] = None,
             seed: int = 0) -> "Model":
        """Random weights (the same bits as `lockstep init`) for a preset or a config dict."""
        return Model(_lockstep.ModelWeights.init(
            preset, None if config is None else json.dumps(config), seed))

    @staticmethod
    def presets() -> List[str]:
        return list(_lockstep.ModelWeights.presets())

    @property
    def config(self) -> Dict[str, Any]:
        """The Hugging Face config fields."""
        return json.loads(self._w.config_json_text)

    @property
    def handle(self) -> "_lockstep.ModelWeights":
        return self._w

    def names(self) -> List[str]:
        return list(self._w.names())

    def tensor(self, name: str, framework: str = "numpy") -> Any:
        """A weight by lockstep name, over the model's own memory."""
        return _arrays.wrap(self._w.tensor(name), framework)

    def save(self, path: str, dtype: str = "f32") -> None:
        """A model directory (config.json + model.safetensors) that lockstep and transformers load."""
        self._w.save(str(path), dtype)


def pack(sequences: Sequence[Sequence[int]]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, targets, cu_seqlens) to score every next token of each sequence: sequence s
    contributes s[:-1] as inputs and s[1:] as targets."""
    toks: List[int] = []
    tgts: List[int] = []
    cu = [0]
    for s in sequences:
        if len(s) < 2:
            raise _lockstep.Error("pack: every sequence needs at least 2 tokens")
        toks.extend(s[:-1])
        tgts.extend(s[1:])
        cu.append(len(toks))
    return (np.asarray(toks, dtype=np.int32), np.asarray(tgts, dtype=np.int32),
            np.asarray(cu, dtype=np.int64))


class Learner:
    """The learner: fp32 masters, log-probs and entropy of packed sequences, backward, AdamW."""

    __slots__ = ("_l", "recipe")

    def __init__(self, model: Model, recipe: Any = None, deterministic: bool = True,
                 temperature: float = 1.0, lr: float = 1e-3, weight_decay: float = 0.0,
                 max_grad_norm: float = 1.0, seed: int = 0):
        self.recipe = as_recipe(recipe)
        self._l = _lockstep.Learner(model.handle, self.recipe.handle, deterministic=deterministic,
                                    temperature=temperature, lr=lr, weight_decay=weight_decay,
                                    max_grad_norm=max_grad_norm, seed=seed)

    def forward(self, tokens: Any, cu_seqlens: Any, targets: Any) -> Tuple[np.ndarray, np.ndarray]:
        """(log-prob of each target, entropy) [n] of a packed batch: tokens, targets int32 [n],
        cu_seqlens [b + 1]. Keeps what backward() needs."""
        logp, ent = self._l.forward(_ids(tokens, "Learner.forward: tokens"),
                                    _ids(cu_seqlens, "Learner.forward: cu_seqlens", np.int64),
                                    _ids(targets, "Learner.forward: targets"))
        return np.from_dlpack(logp), np.from_dlpack(ent)

    def sequence_logprobs(self, sequences: Sequence[Sequence[int]]) -> List[np.ndarray]:
        """Per sequence, the log-prob of tokens 1..n-1 given their prefix (one packed forward):
        what another engine's scores are compared with."""
        tokens, targets, cu = pack(sequences)
        logp, _ = self.forward(tokens, cu, targets)
        return [logp[cu[i]:cu[i + 1]] for i in range(len(cu) - 1)]

    def logits(self, tokens: Any, cu_seqlens: Any) -> np.ndarray:
        return np.from_dlpack(self._l.logits(_ids(tokens, "Learner.logits: tokens"),
                                             _ids(cu_seqlens, "Learner.logits: cu_seqlens", np.int64)))

    def backward(self, dlogp: Any, dentropy: Any = None) -> None:
        """Adds the gradients of sum dlogp * logp + dentropy * entropy of the last forward."""
        self._l.backward(_f32(dlogp), None if dentropy is None else _f32(dentropy))

    def step(self) -> Dict[str, Any]:
        """Gradient clipping and AdamW; the version advances."""
        return dict(self._l.step())

    @property
    def version(self) -> int:
        return self._l.version

    def export_policy(self, force_bf16: bool = False) -> "_lockstep.PolicyVersion":
        """The sampler's copy of the current weights, prepared once by the recipe."""
        return self._l.export_policy(force_bf16)

    def save_checkpoint(self, path: str) -> None:
        self._l.save_checkpoint(str(path))


class Sampler:
    """The sampler: KV cache, continuous batching, temperature / top-k / top-p sampling with one
    Philox draw per (sequence, position), returning tokens and their log-probs."""

    __slots__ = ("_s",)

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 max_new: int = 16, seed: int = 0, kv_cache: str = "bf16", max_batch: int = 64,
                 eos: Optional[int] = None):
        self._s = _lockstep.Sampler(temperature=temperature, top_p=top_p, top_k=top_k,
                                    max_new=max_new, seed=seed, kv_cache=kv_cache,
                                    max_batch=max_batch, eos=eos)

    def load(self, policy: "_lockstep.PolicyVersion", expected_version: Optional[int] = None,
             expected_recipe: str = "") -> None:
        """Installs a policy version after checking its version, recipe and checksum."""
        self._s.load_policy(policy, policy.version if expected_version is None else expected_version,
                            expected_recipe)

    @property
    def version(self) -> int:
        return self._s.version

    def generate(self, prompts: Sequence[Sequence[int]],
                 streams: Optional[Sequence[int]] = None) -> List[Dict[str, Any]]:
        """[{tokens, logprobs, eos}] per prompt, in order; prompt i draws Philox stream
        streams[i] (default i)."""
        return list(self._s.generate([list(map(int, p)) for p in prompts],
                                     None if streams is None else list(streams)))

    def score(self, prompt: Sequence[int], continuation: Sequence[int]) -> List[float]:
        """Teacher-forced log-probs of `continuation` after `prompt`, through the KV cache."""
        return list(self._s.score(list(prompt), list(continuation)))


def export_policy(model: Model, recipe: Any = None, version: int = 0) -> "_lockstep.PolicyVersion":
    return _lockstep.export_policy(model.handle, as_recipe(recipe).handle, version)


def rl_step(learner: Learner, sampler: Sampler, prompts: Sequence[Sequence[int]],
            reward: Callable[[Sequence[int], List[int]], float], group: int = 8,
            guard: str = "tis", kl_coef: float = 0.0, stream_base: int = 0) -> Dict[str, Any]:
    """One GRPO update: sample `group` responses per prompt, reward them, group advantages, the
    learner's log-probs of the same tokens, the guarded objective, backward, AdamW, and the new
    policy version loaded into the sampler. Returns the step's statistics."""
    reqs = [list(p) for p in prompts for _ in range(group)]
    outs = sampler.generate(reqs, [stream_base + i for i in range(len(reqs))])
    rewards = np.asarray([reward(p, o["tokens"]) for p, o in zip(reqs, outs)], dtype=np.float32)
    adv = grpo_advantages(rewards, group)
    seqs, resp_pos, offsets, slp = [], [], [0], []
    cursor = 0
    for p, o in zip(reqs, outs):
        s = p + o["tokens"]
        n_in = len(s) - 1
        seqs.append(s)
        resp_pos.extend(range(cursor + len(p) - 1, cursor + n_in))
        cursor += n_in
        offsets.append(offsets[-1] + len(o["tokens"]))
        slp.extend(o["logprobs"])
    tokens, targets, cu = pack(seqs)
    logp_all, _ = learner.forward(tokens, cu, targets)
    pos = np.asarray(resp_pos, dtype=np.int64)
    logp = logp_all[pos].astype(np.float32)
    sampler_logp = np.asarray(slp, dtype=np.float32)
    mask = np.ones(len(pos), dtype=np.uint8)
    offs = np.asarray(offsets, dtype=np.int64)
    loss, grad, stats = objective(logp, logp, adv, mask, offsets=offs, logp_sampler=sampler_logp,
                                  guard=guard, kl_coef=kl_coef)
    dlogp = np.zeros(len(tokens), dtype=np.float32)
    dlogp[pos] = grad
    learner.backward(dlogp)
    step = learner.step()
    sampler.load(learner.export_policy(), learner.version, learner.recipe.name)
    return {"reward_mean": float(rewards.mean()), "loss": loss, "objective": stats,
            "mismatch": align_stats(logp, sampler_logp, adv, mask, offsets=offs), **step}


def _ids(x: Any, what: str, dtype=np.int32) -> Any:
    """Integer ids (tokens, targets, cu_seqlens) as a host array of `dtype`; other dtypes raise."""
    if isinstance(x, (list, tuple)):
        return np.asarray(x, dtype=dtype)
    fw = _arrays.framework_of(x)
    if fw == "torch":
        import torch

        if x.dtype.is_floating_point or x.dtype.is_complex:
            raise _lockstep.Error(f"{what}: token ids must be integers, not {x.dtype}")
        return x.detach().to(torch.int32 if dtype == np.int32 else torch.int64).contiguous()
    x = np.asarray(x)
    if x.dtype.kind not in "iu":
        raise _lockstep.Error(f"{what}: token ids must be integers, not {x.dtype}")
    return np.ascontiguousarray(x, dtype=dtype)


def _f32(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return np.asarray(x, dtype=np.float32)
    if _arrays.framework_of(x) == "torch":
        import torch

        return x.detach().to(torch.float32).contiguous()
    return np.ascontiguousarray(x, dtype=np.float32)


__all__ = ["Model", "Learner", "Sampler", "export_policy", "rl_step", "pack", "Recipe"]
