"""Arrays in and out of the extension without copies: which framework an array comes from, the CUDA
stream a call runs on (the caller's current stream), and DLPack arrays back into that framework.

Inputs travel as the caller's own object (nanobind reads its __dlpack__), or as a DLPack capsule
taken with the caller's stream when one was given explicitly. Outputs come back as DLPack arrays
and are turned into the input's framework: torch in, torch out; NumPy in, NumPy out.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

from . import _lockstep

# NumPy dtypes from ml_dtypes that DLPack cannot carry: passed as same-size unsigned views with
# the real dtype named for the extension.
_ML_DTYPES = {
    "bfloat16": ("uint16", "bf16"),
    "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
    "float8_e5m2": ("uint8", "float8_e5m2"),
    "float8_e8m0fnu": ("uint8", "float8_e8m0fnu"),
}


def framework_of(x: Any) -> str:
    """'torch', 'numpy', 'cupy', 'jax' or 'dlpack' (any other object with __dlpack__)."""
    mod = type(x).__module__ or ""
    for name in ("torch", "numpy", "cupy", "jax"):
        if mod == name or mod.startswith(name + ".") or mod.startswith(name + "lib"):
            return name
    return "dlpack"


def _torch_current_stream(device) -> int:
    import torch

    return torch.cuda.current_stream(device).cuda_stream


def stream_handle(stream: Any) -> int:
    """A raw cudaStream_t from an int, a torch.cuda.Stream (.cuda_stream) or a CuPy stream (.ptr)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise _lockstep.Error(
        f"stream: {type(stream).__name__} is not a CUDA stream (an int handle, a "
        "torch.cuda.Stream or a CuPy stream)")


def prepare(x: Any, stream: Any = None) -> Tuple[Any, Optional[str], int, str]:
    """(object for the extension, dtype override (None), stream handle, framework) of one input.
    NumPy arrays of ml_dtypes types (bfloat16, float8) go as views with their real dtype.

    The stream: the one given, else for a CUDA torch / CuPy array the caller's current stream of
    its device, else 0. With an explicit torch stream other than the current one, the tensor is
    exported through __dlpack__(stream=...), so torch orders its pending work before ours.
    """
    fw = framework_of(x)
    as_dtype = None
    handle = stream_handle(stream)
    if fw == "torch":
        if x.requires_grad:
            x = x.detach()
        if x.is_cuda:
            current = _torch_current_stream(x.device)
            if stream is None:
                handle = current
            elif handle != current:
                x = x.__dlpack__(stream=handle)
    elif fw == "numpy":
        name = x.dtype.name
        if name in _ML_DTYPES:
            view, real = _ML_DTYPES[name]
            x = _lockstep._view_as(x.view(view), real)
    elif fw == "cupy" and stream is None:
        import cupy

        handle = cupy.cuda.get_current_stream().ptr
    return x, as_dtype, handle, fw


def default_stream(device: str, framework: str, stream: Any = None) -> int:
    """The stream for work on `device` when no input array says it (QTensor methods)."""
    if stream is not None:
        return stream_handle(stream)
    if device.startswith("cuda") and framework == "torch":
        import torch

        return torch.cuda.current_stream(torch.device(device)).cuda_stream
    if device.startswith("cuda") and framework == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def wrap(arr: Any, framework: str, bf16: bool = False) -> Any:
    """A DLPack array from the extension as the framework's array (None stays None). NumPy, which
    has no bfloat16, gets bfloat16 arrays as ml_dtypes.bfloat16 (uint16 without ml_dtypes)."""
    if arr is None:
        return None
    if framework == "torch":
        import torch

        return torch.from_dlpack(arr)
    if framework == "numpy":
        import numpy as np

        if bf16 or _lockstep._dtype_name(arr) == "BF16":
            u16 = np.from_dlpack(_lockstep._view_as(arr, "u16"))
            try:
                import ml_dtypes

                return u16.view(ml_dtypes.bfloat16)
            except ImportError:
                return u16
        return np.from_dlpack(arr)
    if framework == "cupy":
        import cupy

        return cupy.from_dlpack(arr)
    if framework == "jax":
        import jax.dlpack

        return jax.dlpack.from_dlpack(arr)
    return arr


def torch_loaded() -> bool:
    return "torch" in sys.modules
