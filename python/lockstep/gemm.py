"""Quantized GEMMs: D = A W^T of QTensors or dense arrays (bf16 / f32 / f64), dense and grouped
(MoE), with the fused epilogue, on the operands' device (docs/gemm.md states the semantics)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from . import _arrays, _lockstep
from .quant import QTensor


@dataclass
class GemmConfig:
    """Options of one GEMM (lockstep::GemmConfig).

    order: 'batch_invariant' (every output element reduced in an order fixed by K alone) or
    'fast'. a_copy / w_copy: which copy of each operand: fprop (rowwise, rowwise), dgrad
    (rowwise, colwise), wgrad (colwise, colwise). Epilogue, in this order: alpha, bias, swiglu
    (with router_prob), bf16 rounding when out_dtype is bf16, row_amax.
    """
    out_dtype: str = "f32"
    order: str = "batch_invariant"
    a_copy: str = "rowwise"
    w_copy: str = "rowwise"
    kernel: str = "auto"
    alpha: float = 1.0
    bias: Any = None          # f32 [N] (grouped: [groups * N])
    swiglu: bool = False
    router_prob: Any = None   # f32 [M]
    row_amax: bool = False
    group_rows: Any = None    # int64 [groups] tokens per group (grouped; padding rows give +0)
    max_group_rows: int = -1  # host bound on rows per group when offsets live on the device

    def _args(self) -> "_lockstep.GemmArgs":
        a = _lockstep.GemmArgs()
        for k in ("out_dtype", "order", "a_copy", "w_copy", "kernel", "alpha", "swiglu",
                  "row_amax", "max_group_rows"):
            setattr(a, k, getattr(self, k))
        return a


class GemmResult(NamedTuple):
    d: Any                   # [M, N] (N / 2 with swiglu)
    row_amax: Optional[Any]  # f32 [M] when asked
    kernel: str              # the kernel that ran


def _side(x: Any, stream: Any):
    if isinstance(x, QTensor):
        return x.handle, x.framework, _arrays.default_stream(x.device, x.framework, stream)
    obj, _, handle, fw = _arrays.prepare(x, stream)
    return obj, fw, handle


def _opt(x: Any):
    return None if x is None else _arrays.prepare(x)[0]


def qgemm(a: Any, w: Any, config: Optional[GemmConfig] = None, stream: Any = None) -> GemmResult:
    """D = A W^T: A [M, K], W [N, K] (as the copies in config describe them); QTensors or arrays."""
    c = config or GemmConfig()
    ha, fw, s = _side(a, stream)
    hw, _, _ = _side(w, stream)
    d, amax, kernel = _lockstep.qgemm(ha, hw, c._args(), bias=_opt(c.bias),
                                      router_prob=_opt(c.router_prob), stream=s)
    return GemmResult(_arrays.wrap(d, fw), _arrays.wrap(amax, fw), kernel)


def grouped_qgemm(a: Any, offsets: Any, w: Any, config: Optional[GemmConfig] = None,
                  stream: Any = None) -> GemmResult:
    """Grouped (MoE) GEMM. offsets: int64 [groups + 1] on the host or the operands' device.
    a_copy rowwise: A [sum_rows, K] grouped by rows, W [groups * N, K], D [sum_rows, N]; a_copy
    and w_copy colwise (wgrad): D_e = A_e^T W_e, D [groups * Na, Nw]."""
    c = config or GemmConfig()
    ha, fw, s = _side(a, stream)
    hw, _, _ = _side(w, stream)
    offs = _arrays.prepare(offsets)[0]
    d, amax, kernel = _lockstep.grouped_qgemm(ha, offs, hw, c._args(), bias=_opt(c.bias),
                                              router_prob=_opt(c.router_prob),
                                              group_rows=_opt(c.group_rows), stream=s)
    return GemmResult(_arrays.wrap(d, fw), _arrays.wrap(amax, fw), kernel)


__all__ = ["GemmConfig", "GemmResult", "qgemm", "grouped_qgemm"]
