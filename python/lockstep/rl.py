"""RL numerics for any trainer (docs/rl.md): learner-sampler mismatch statistics, TIS and TRIAGE
weights, GRPO advantages and the combined objective, as functions on per-token arrays.

Layouts: packed 1-D arrays [T] with `offsets` [R + 1] (response i owns tokens
offsets[i]..offsets[i+1]), or padded 2-D arrays [R, L] with a mask (offsets are i * L). Results
come back in the input's framework, shape and device. They run on the host: arrays on a GPU are
copied there and the weights copied back (small per-token arrays; not a hot path).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from . import _arrays, _lockstep


def _layout(x: Any, offsets: Any) -> Tuple[Any, Any, Any]:
    """(flat view of x, offsets, original shape) for packed or padded inputs."""
    shape = tuple(x.shape)
    if len(shape) == 2:
        if offsets is not None:
            raise _lockstep.Error("offsets: give offsets for packed 1-D arrays only (2-D arrays "
                                  "are padded [responses, length])")
        import numpy as np

        r, length = shape
        return x.reshape(-1), np.arange(r + 1, dtype=np.int64) * length, shape
    if len(shape) != 1:
        raise _lockstep.Error(f"expected [tokens] or [responses, length] arrays, got shape {shape}")
    if offsets is None:
        raise _lockstep.Error("offsets: packed 1-D arrays need offsets [responses + 1]")
    return x, offsets, shape


def _flat(x: Any) -> Any:
    return None if x is None else _arrays.prepare(x.reshape(-1))[0]


def _back(arr: Any, like: Any, shape: Tuple[int, ...]) -> Any:
    fw = _arrays.framework_of(like)
    out = _arrays.wrap(arr, fw)
    if fw == "torch" and like.is_cuda:
        out = out.to(like.device)
    return out.reshape(shape) if hasattr(out, "reshape") else out


def align_stats(learner_logp: Any, sampler_logp: Any, advantages: Any, mask: Any,
                offsets: Any = None) -> Dict[str, float]:
    """Mismatch statistics of delta = learner log-prob - sampler log-prob over valid tokens:
    gap_tokens, mean_gap, mean_abs_gap, max_abs_gap, q05_gap, the 64-token segment counts and
    the |A|-weighted directional shares (docs/rl.md "Mismatch diagnostics")."""
    flat, offs, _ = _layout(learner_logp, offsets)
    return dict(_lockstep.mismatch_stats(_arrays.prepare(offs)[0], _flat(flat),
                                         _flat(sampler_logp), _flat(mask), _flat(advantages)))


def tis_weights(logp_old: Any, logp_sampler: Any, mask: Any, cap: float = 2.0,
                return_stats: bool = False) -> Any:
    """Truncated importance weights clamp(exp(logp_old - logp_sampler), 0, cap), 0 on masked
    tokens, detached; same shape as logp_old. return_stats: also weight_mean / max / clip_frac."""
    w, stats = _lockstep.tis_weights(_flat(logp_old), _flat(logp_sampler), _flat(mask), cap)
    out = _back(w, logp_old, tuple(logp_old.shape))
    return (out, dict(stats)) if return_stats else out


def triage_weights(logp_old: Any, logp_sampler: Any, advantages: Any, mask: Any,
                   offsets: Any = None, return_stats: bool = False) -> Any:
    """TRIAGE gate weights (docs/rl.md): negative-advantage responses' 64-token segments whose
    mean gap or tail says the sampler went where the learner would not are down-weighted."""
    flat, offs, shape = _layout(logp_old, offsets)
    w, stats = _lockstep.triage_weights(_arrays.prepare(offs)[0], _flat(flat),
                                        _flat(logp_sampler), _flat(mask), _flat(advantages))
    out = _back(w, logp_old, shape)
    return (out, dict(stats)) if return_stats else out


def grpo_advantages(rewards: Any, group_size: int) -> Any:
    """(r - group mean) / (group population std + 1e-6) per sample; groups contiguous."""
    return _back(_lockstep.grpo_advantages(_flat(rewards), group_size), rewards,
                 tuple(rewards.shape))


def objective(logp_new: Any, logp_old: Any, advantages: Any, mask: Any, offsets: Any = None,
              logp_sampler: Any = None, logp_ref: Any = None, guard: str = "none",
              clip_low: float = 0.2, clip_high: float = 0.28, kl_coef: float = 0.0,
              normalization: str = "response", tis_cap: float = 2.0) -> Tuple[float, Any, Dict]:
    """(loss, d loss / d logp_new per token, stats) of clipped GRPO with the guard ('none',
    'tis', 'triage', 'tis+triage'), exactly as `lockstep train` computes it."""
    flat, offs, shape = _layout(logp_new, offsets)
    loss, grad, stats = _lockstep.objective(
        _arrays.prepare(offs)[0], _flat(flat), _flat(logp_old), _flat(logp_sampler),
        _flat(logp_ref), _flat(mask), _flat(advantages), guard=guard, clip_low=clip_low,
        clip_high=clip_high, kl_coef=kl_coef, normalization=normalization, tis_cap=tis_cap)
    return loss, _back(grad, logp_new, shape), dict(stats)


__all__ = ["align_stats", "tis_weights", "triage_weights", "grpo_advantages", "objective"]
