"""The framework-independent core of lockstep.torch's modules: one call of nn::Linear /
nn::GroupedLinear (the C++ modules themselves) on 2-D float32 arrays, with the gradient
accumulator the backward fills. lockstep.torch wraps these in torch.autograd.Function; keeping
the logic here lets it run (and be tested) on NumPy arrays too.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from . import _lockstep
from .recipes import Recipe


class LinearCall:
    """One forward (and its backward) of nn::Linear over a weight W [N, K] float32. gemm_order:
    'batch_invariant' (the default) or 'fast' (docs/gemm.md).

    grad: a zero float32 array of W's shape (on W's device) that the backward adds dW into, or
    None when no weight gradient is wanted. The C++ module is made per call, so calls can
    overlap (several forwards before their backwards) without sharing saved state.
    """

    __slots__ = ("module", "grad")

    def __init__(self, name: str, weight: Any, grad: Optional[Any], recipe: Recipe,
                 module_class: Optional[str] = None, layer: int = -1, layers: int = 1,
                 rng_stream: int = 0, grad_seed: int = 0, gemm_order: str = "batch_invariant"):
        self.module = _lockstep.Linear(name, weight, grad, recipe.handle, module_class or "",
                                       layer, layers, rng_stream)
        self.module.set_grad_seed(grad_seed)
        self.module.set_gemm_order(gemm_order)
        self.grad = grad

    def forward(self, x2: Any, save: bool, stream: int = 0) -> Any:
        """x2 [T, K] float32 -> y [T, N] float32 (a DLPack array), on `stream` (a CUDA handle)."""
        return self.module.forward(x2, save, stream)

    def backward(self, dy2: Any, stream: int = 0) -> Any:
        """dy2 [T, N] float32 -> dx [T, K]; dW added into self.grad."""
        return self.module.backward(dy2, stream)


class GroupedLinearCall:
    """One forward / backward of nn::GroupedLinear: W [groups * N, K], rows grouped by offsets."""

    __slots__ = ("module", "grad", "offsets")

    def __init__(self, name: str, weight: Any, grad: Optional[Any], groups: int, recipe: Recipe,
                 module_class: Optional[str] = "experts_fc1", layer: int = -1, layers: int = 1,
                 rng_stream: int = 0, grad_seed: int = 0, gemm_order: str = "batch_invariant"):
        self.module = _lockstep.GroupedLinear(name, weight, grad, groups, recipe.handle,
                                              module_class or "", layer, layers, rng_stream)
        self.module.set_grad_seed(grad_seed)
        self.module.set_gemm_order(gemm_order)
        self.grad = grad
        self.offsets: List[int] = []

    def forward(self, x2: Any, m_splits: Sequence[int], save: bool, stream: int = 0) -> Any:
        offsets = [0]
        for m in m_splits:
            if int(m) < 0:
                raise _lockstep.Error(f"grouped linear: m_splits has a negative count {m}")
            offsets.append(offsets[-1] + int(m))
        self.offsets = offsets
        return self.module.forward(x2, offsets, save, stream)

    def backward(self, dy2: Any, stream: int = 0) -> Any:
        return self.module.backward(dy2, stream)


def splits_from(m_splits: Sequence[int], groups: int, rows: int) -> Tuple[int, ...]:
    """Validated per-group row counts (one per group, summing to the input's rows)."""
    s = tuple(int(m) for m in m_splits)
    if len(s) != groups:
        raise _lockstep.Error(f"grouped linear: m_splits has {len(s)} entries for {groups} groups")
    if sum(s) != rows:
        raise _lockstep.Error(f"grouped linear: m_splits sum to {sum(s)} but the input has {rows} rows")
    return s
