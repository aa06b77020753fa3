"""Quantize, dequantize and the QTensor: the contract's bytes (docs/CONTRACT.md) computed where the
input lives, with every part of the result (element codes, block scales, amax / scale_inv, the
columnwise copy) available as an array of the input's framework over lockstep's own memory.

FP4 / FP8 / E8M0 parts travel as uint8 arrays; `QTensor.dtype_of(part)` names the real dtype
("float4_e2m1fn_x2", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"), and
`QTensor.typed(part)` gives a torch view with that dtype where torch has it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _arrays, _lockstep

PARTS = ("data", "block_scale", "amax", "scale_inv",
         "data_colwise", "block_scale_colwise", "amax_colwise", "scale_inv_colwise")

_FILE_SUFFIX = {"data": "qdata", "block_scale": "block_scale", "amax": "amax",
                "scale_inv": "scale_inv"}


class QTensor:
    """A quantized 2-D tensor [rows, cols]: a handle on lockstep's QTensor. Parts are converted to
    the framework's arrays on first access (no copy) and cached."""

    __slots__ = ("_q", "_fw", "_cache")

    def __init__(self, handle: "_lockstep.QTensor", framework: str = "numpy"):
        self._q = handle
        self._fw = framework
        self._cache: Dict[str, Any] = {}

    # -- what it is ------------------------------------------------------------------------
    format = property(lambda self: self._q.format, doc="nvfp4, mxfp8 or fp8")
    scaling = property(lambda self: self._q.scaling)
    elem = property(lambda self: self._q.elem, doc="e4m3 or e5m2 (fp8, mxfp8)")
    block2d = property(lambda self: self._q.block2d)
    hadamard = property(lambda self: self._q.hadamard)
    scale_layout = property(lambda self: self._q.scale_layout)
    source_dtype = property(lambda self: self._q.source_dtype, doc="F32, BF16 or F16")
    device = property(lambda self: self._q.device, doc="'cpu' or 'cuda:N'")
    group_offsets = property(lambda self: list(self._q.group_offsets))
    has_rowwise = property(lambda self: self._q.has_rowwise)
    has_colwise = property(lambda self: self._q.has_colwise)
    framework = property(lambda self: self._fw, doc="framework of the part arrays")
    handle = property(lambda self: self._q, doc="the extension's QTensor")

    @property
    def shape(self) -> Tuple[int, int]:
        return (self._q.rows, self._q.cols)

    def dtype_of(self, part: str) -> str:
        """The real dtype of a part ('uint8' arrays hold FP4 pairs, FP8 or E8M0 codes)."""
        base = part[: -len("_colwise")] if part.endswith("_colwise") else part
        if base in ("amax", "scale_inv"):
            return "float32"
        if base == "block_scale":
            return "float8_e4m3fn" if self.format == "nvfp4" else "float8_e8m0fnu"
        if base == "data":
            if self.format == "nvfp4":
                return "float4_e2m1fn_x2"  # two E2M1 codes per byte, even column low
            return "float8_e5m2" if self.elem == "e5m2" else "float8_e4m3fn"
        raise _lockstep.Error(f"QTensor: no part '{part}' ({', '.join(PARTS)})")

    # -- parts -----------------------------------------------------------------------------
    def part(self, name: str) -> Any:
        """One part as an array of this QTensor's framework (None when absent)."""
        if name not in self._cache:
            self._cache[name] = _arrays.wrap(self._q.part(name), self._fw)
        return self._cache[name]

    data = property(lambda self: self.part("data"))
    block_scale = property(lambda self: self.part("block_scale"))
    amax = property(lambda self: self.part("amax"))
    scale_inv = property(lambda self: self.part("scale_inv"))
    data_colwise = property(lambda self: self.part("data_colwise"))
    block_scale_colwise = property(lambda self: self.part("block_scale_colwise"))
    amax_colwise = property(lambda self: self.part("amax_colwise"))
    scale_inv_colwise = property(lambda self: self.part("scale_inv_colwise"))

    def parts(self) -> Dict[str, Any]:
        """Every part present, by name."""
        return {n: self.part(n) for n in self._q.parts()}

    def typed(self, name: str) -> Any:
        """A torch part viewed with its real dtype (torch.float8_e4m3fn, ...); uint8 elsewhere."""
        arr = self.part(name)
        if self._fw != "torch" or arr is None:
            return arr
        import torch

        dt = getattr(torch, self.dtype_of(name), None)
        return arr.view(dt) if dt is not None else arr

    @property
    def nbytes(self) -> int:
        return sum(int(self._q.part(n).nbytes) for n in self._q.parts())

    # -- operations ------------------------------------------------------------------------
    def dequantize(self, dtype: str = "f32", copy: str = "rowwise", stream: Any = None) -> Any:
        """X rebuilt from one copy (f32, or bf16 rounded to nearest even), on the QTensor's device:
        [rows, cols] from either copy."""
        return dequantize(self, dtype=dtype, copy=copy, stream=stream)

    def to(self, device: Any, stream: Any = None) -> "QTensor":
        """A copy on `device` ('cpu', 'cuda', 'cuda:N' or a torch.device); parts already there are
        shared."""
        dev = str(device)
        s = _arrays.default_stream(dev if dev.startswith("cuda") else self.device, self._fw, stream)
        return QTensor(self._q.to(dev, s), self._fw)

    def save(self, path: str, name: str = "x") -> None:
        """Write this QTensor as `name` to a safetensors file in the contract's naming."""
        save_file(path, {name: self})

    @staticmethod
    def load(path: str, name: str = "x", device: str = "cpu", framework: str = "numpy") -> "QTensor":
        tensors, _ = load_file(path, device=device, framework=framework)
        if name not in tensors or not isinstance(tensors[name], QTensor):
            raise _lockstep.FileError(f"{path}: no quantized tensor '{name}'")
        return tensors[name]

    def __repr__(self) -> str:
        return f"lockstep.QTensor({self._q.describe()}, parts={self._q.parts()})"


def quantize(x: Any, fmt: str, scaling: Optional[str] = None, block2d: bool = False,
             stochastic: bool = False, seed: int = 0, colwise: bool = False, *,
             rowwise: bool = True, rng_stream: int = 0, pow2: bool = False, eps: float = 0.0,
             elem: str = "e4m3", hadamard: bool = False, scale_layout: str = "compact",
             offsets: Optional[Sequence[int]] = None, stream: Any = None,
             name: str = "x") -> QTensor:
    """Quantize a 2-D float32 / bfloat16 (/ float16 on the CPU) array where it lives.

    fmt: nvfp4, mxfp8 or fp8. scaling: nvfp4 per_tensor (default) / per_row / per_group; mxfp8
    block_1x32; fp8 per_tensor (default) / per_row / block_1x128 / block_128x128. offsets: group
    row offsets of a grouped (MoE) buffer (per_group needs them). stream: CUDA stream (default:
    the caller's current stream). The bytes equal `lockstep quantize` on the same values.
    Non-finite values follow the contract's NaN / Inf rules (the CLI refuses them by default).
    """
    obj, as_dtype, handle, fw = _arrays.prepare(x, stream)
    q = _lockstep.quantize(obj, fmt, scaling, block2d=block2d, rowwise=rowwise, colwise=colwise,
                           stochastic=stochastic, seed=seed, rng_stream=rng_stream, pow2=pow2,
                           eps=eps, elem=elem, hadamard=hadamard, scale_layout=scale_layout,
                           offsets=None if offsets is None else list(offsets), stream=handle,
                           name=name, as_dtype=as_dtype)
    return QTensor(q, fw)


def dequantize(q: QTensor, dtype: str = "f32", copy: str = "rowwise", stream: Any = None) -> Any:
    """X [rows, cols] rebuilt from the rowwise or columnwise copy, as f32 or bf16."""
    if not isinstance(q, QTensor):
        raise _lockstep.Error(f"dequantize: q must be a lockstep.QTensor, not {type(q).__name__}")
    s = _arrays.default_stream(q.device, q.framework, stream)
    arr = _lockstep.dequantize(q.handle, dtype=dtype, copy=copy, stream=s)
    return _arrays.wrap(arr, q.framework, bf16=dtype in ("bf16", "bfloat16"))


def save_file(path: str, tensors: Mapping[str, Union[QTensor, Any]],
              metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write tensors and QTensors to one safetensors file (atomically): QTensor NAME as
    NAME.qdata, NAME.block_scale, ... with lockstep.NAME.* metadata (CONTRACT.md section 11)."""
    items = {}
    for k, v in tensors.items():
        if isinstance(v, QTensor):
            items[k] = v.handle
        else:
            items[k] = _arrays.prepare(v)[0]
    _lockstep.save_file(path, items, dict(metadata or {}))


def load_file(path: str, device: str = "cpu",
              framework: str = "numpy") -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(tensors, metadata) of a safetensors file: quantized tensors as QTensors, others as arrays
    of `framework` ('numpy', 'torch', ...), all on `device`."""
    raw, meta = _lockstep.load_file(path, str(device))
    out: Dict[str, Any] = {}
    for k, v in raw.items():
        out[k] = QTensor(v, framework) if isinstance(v, _lockstep.QTensor) else _arrays.wrap(v, framework)
    return out, dict(meta)


__all__ = ["QTensor", "quantize", "dequantize", "save_file", "load_file", "PARTS"]
