"""PyTorch modules in Transformer Engine's style, running lockstep's C++ modules (nn::Linear,
nn::GroupedLinear) inside torch.autograd.Function: the recipe decides every GEMM's format and the
backward mode, and the bytes equal the C++ learner's for the same inputs.

    import lockstep.torch as lt
    layer = lt.Linear(1024, 4096)
    with lt.autocast(recipe="nvfp4_per_token"):
        y = layer(x)          # x: [..., 1024] float32 / bfloat16, CPU or CUDA
    y.sum().backward()

Inputs are widened to float32 (exact for bf16 / f16), the module computes in float32 and the
output is rounded to the input's dtype (round to nearest even). Weights are float32 masters.
Importing this module imports torch; the rest of lockstep never does.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Iterator, Optional, Sequence, Union

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("lockstep.torch needs PyTorch (pip install torch); the rest of lockstep "
                      "works without it") from e

from .. import _lockstep
from .._modules import GroupedLinearCall, LinearCall, splits_from
from ..recipes import Recipe, as_recipe

_state = threading.local()

RecipeLike = Union[Recipe, str, dict, None]


def _stack() -> list:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


@contextlib.contextmanager
def autocast(enabled: bool = True, recipe: RecipeLike = None) -> Iterator[Recipe]:
    """Modules run inside use `recipe` (a Recipe, a built-in name or a dict; default: the
    selection precedence, $LOCKSTEP_RECIPE then bf16); enabled=False runs them in bf16. A module
    given its own recipe keeps it (explicit per-module choices beat the context)."""
    r = as_recipe(recipe) if enabled else Recipe.from_name("bf16")
    _stack().append(r)
    try:
        yield r
    finally:
        _stack().pop()


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe: RecipeLike = None) -> Iterator[None]:
    """Linear modules created inside keep only their quantized forward weight (prepared once by
    the recipe, as the converter prepares a policy version) and no float32 master: forward-only
    modules for a sampler or an evaluator (Transformer Engine's fp8_model_init)."""
    prev = getattr(_state, "qinit", None)
    _state.qinit = as_recipe(recipe) if enabled else None
    try:
        yield
    finally:
        _state.qinit = prev


def active_recipe() -> Recipe:
    """The recipe of the innermost autocast, else the selection precedence."""
    s = _stack()
    return s[-1] if s else Recipe.select()


def _f32_2d(x: torch.Tensor, cols: int) -> torch.Tensor:
    return x.detach().reshape(-1, cols).to(torch.float32).contiguous()


def _stream(t: torch.Tensor) -> int:
    """The caller's current stream on t's device (0 on the CPU)."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, mod):  # type: ignore[override]
        k = weight.shape[1]
        x2 = _f32_2d(x, k)
        need_w = ctx.needs_input_grad[1]
        save = ctx.needs_input_grad[0] or need_w
        grad = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        call = LinearCall(mod._lockstep_name, weight.detach(), grad, mod._recipe_now(),
                          mod.module_class, mod.layer, mod.layers, mod.rng_stream, mod.grad_seed,
                          mod.gemm_order)
        y = torch.from_dlpack(call.forward(x2, save, _stream(x2)))
        ctx.call = call if save else None
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        call = ctx.call
        dy2 = _f32_2d(dy, dy.shape[-1])
        dx = torch.from_dlpack(call.backward(dy2, _stream(dy2)))
        dx = dx.reshape(ctx.x_shape).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        return dx, call.grad, None


class Linear(torch.nn.Module):
    """y = x W^T (+ bias) with W [out, in] a float32 master; fprop, dgrad and wgrad in the formats
    the recipe gives the module (module_class / layer / layers select the coverage rules; none:
    the recipe's spec for quantized modules). bias is added in float32 outside the contract's
    GEMM. grad_seed: Philox key of stochastic rounding of gradient operands; gemm_order:
    'batch_invariant' (default) or 'fast'."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 recipe: RecipeLike = None, module_class: Optional[str] = None, layer: int = -1,
                 layers: int = 1, rng_stream: int = 0, device: Any = None, name: str = "linear"):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.recipe = None if recipe is None else as_recipe(recipe)
        self.module_class, self.layer, self.layers = module_class, layer, layers
        self.rng_stream, self.grad_seed, self.gemm_order = rng_stream, 0, "batch_invariant"
        self._lockstep_name = name
        w = torch.empty(out_features, in_features, dtype=torch.float32, device=device)
        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        self.bias = (torch.nn.Parameter(torch.zeros(out_features, dtype=torch.float32,
                                                    device=device)) if bias else None)
        qinit = getattr(_state, "qinit", None)
        self._inference = None
        if qinit is not None:
            self.recipe = self.recipe or qinit
            self.weight = None
            self._inference = _lockstep.Linear.inference(name, w, self.recipe.handle,
                                                         module_class or "", layer, layers)
        else:
            self.weight = torch.nn.Parameter(w)

    def _recipe_now(self) -> Recipe:
        return self.recipe if self.recipe is not None else active_recipe()

    def quantized_weight(self) -> Any:
        """The forward weight operand the module reads (a lockstep.QTensor for quantized
        formats; quantized_model_init modules keep only this)."""
        from ..quant import QTensor

        if self._inference is not None:
            h = self._inference.fprop_weight()
        else:
            h = LinearCall(self._lockstep_name, self.weight.detach(), None, self._recipe_now(),
                           self.module_class, self.layer, self.layers).module.fprop_weight()
        return QTensor(h, "torch") if isinstance(h, _lockstep.QTensor) else torch.from_dlpack(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise _lockstep.Error(f"{self._lockstep_name}: input {tuple(x.shape)} does not end in "
                                  f"in_features {self.in_features}")
        if self._inference is not None:
            if torch.is_grad_enabled() and x.requires_grad:
                raise _lockstep.Error(f"{self._lockstep_name}: made under quantized_model_init, "
                                      "this module is forward-only (run it under torch.no_grad())")
            x2 = _f32_2d(x, self.in_features)
            y2 = torch.from_dlpack(self._inference.forward(x2, False, _stream(x2)))
            y = y2.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        else:
            y = _LinearFunction.apply(x, self.weight, self)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        r = self.recipe.name if self.recipe is not None else "autocast"
        return f"in_features={self.in_features}, out_features={self.out_features}, recipe={r}"


class _GroupedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, mod, m_splits):  # type: ignore[override]
        k = weight.shape[1]
        x2 = _f32_2d(x, k)
        splits = splits_from(m_splits, mod.num_gemms, x2.shape[0])
        need_w = ctx.needs_input_grad[1]
        save = ctx.needs_input_grad[0] or need_w
        grad = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        call = GroupedLinearCall(mod._lockstep_name, weight.detach(), grad, mod.num_gemms,
                                 mod._recipe_now(), mod.module_class, mod.layer, mod.layers,
                                 mod.rng_stream, mod.grad_seed, mod.gemm_order)
        y = torch.from_dlpack(call.forward(x2, splits, save, _stream(x2)))
        ctx.call = call if save else None
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.reshape(*x.shape[:-1], mod.out_features).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        call = ctx.call
        dy2 = _f32_2d(dy, dy.shape[-1])
        dx = torch.from_dlpack(call.backward(dy2, _stream(dy2)))
        dx = dx.reshape(ctx.x_shape).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        return dx, call.grad, None, None


class GroupedLinear(torch.nn.Module):
    """num_gemms GEMMs with weights [out, in] each, stored as one float32 master
    [num_gemms * out, in] (lockstep's expert layout); forward(x, m_splits): rows of x grouped
    by m_splits (one count per GEMM, zeros allowed), as Transformer Engine's GroupedLinear.
    Weights are quantized per group (per_group scaling = one amax per expert)."""

    def __init__(self, num_gemms: int, in_features: int, out_features: int,
                 recipe: RecipeLike = None, module_class: Optional[str] = "experts_fc1",
                 layer: int = -1, layers: int = 1, rng_stream: int = 0, device: Any = None,
                 name: str = "grouped_linear"):
        super().__init__()
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.recipe = None if recipe is None else as_recipe(recipe)
        self.module_class, self.layer, self.layers = module_class, layer, layers
        self.rng_stream, self.grad_seed, self.gemm_order = rng_stream, 0, "batch_invariant"
        self._lockstep_name = name
        w = torch.empty(num_gemms * out_features, in_features, dtype=torch.float32, device=device)
        for g in range(num_gemms):
            torch.nn.init.kaiming_uniform_(w[g * out_features:(g + 1) * out_features],
                                           a=math.sqrt(5))
        self.weight = torch.nn.Parameter(w)

    def _recipe_now(self) -> Recipe:
        return self.recipe if self.recipe is not None else active_recipe()

    def forward(self, x: torch.Tensor, m_splits: Sequence[int]) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise _lockstep.Error(f"{self._lockstep_name}: input {tuple(x.shape)} does not end in "
                                  f"in_features {self.in_features}")
        return _GroupedFunction.apply(x, self.weight, self, list(m_splits))

    def extra_repr(self) -> str:
        r = self.recipe.name if self.recipe is not None else "autocast"
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
                f"out_features={self.out_features}, recipe={r}")


__all__ = ["Linear", "GroupedLinear", "autocast", "quantized_model_init", "active_recipe"]
