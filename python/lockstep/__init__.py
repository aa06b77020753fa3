"""lockstep: one precision contract (NVFP4, MXFP8, FP8) for RL learners and samplers, executed
bit-identically on CPU and GPU, on the arrays your framework already holds (DLPack, no copies).

Parts: quantize / dequantize / QTensor and files (lockstep.quant), qgemm / grouped_qgemm
(lockstep.gemm), recipes (lockstep.recipes), RL numerics (lockstep.rl), model and sampler handles
(lockstep.model), PyTorch modules (lockstep.torch, imported on use). docs/python.md has an example
of each; `python -m lockstep` runs the command-line tool.
"""
from . import _lockstep
from ._lockstep import (Error, FileError, GemmError, QuantError, RecipeError,
                        device_to_host_copies)
from .gemm import GemmConfig, GemmResult, grouped_qgemm, qgemm
from .model import Learner, Model, Sampler, export_policy, rl_step
from .quant import QTensor, dequantize, load_file, quantize, save_file
from .recipes import Recipe, recipes
from .rl import align_stats, grpo_advantages, objective, tis_weights, triage_weights

__version__: str = _lockstep.__version__
revision: str = _lockstep.revision
cuda_compiled: bool = _lockstep.cuda_compiled


def synchronize(device: str = "cuda", stream=None) -> None:
    """Waits for the work lockstep queued on `stream` of `device` (no-op on the CPU)."""
    from ._arrays import stream_handle

    _lockstep.synchronize(str(device), stream_handle(stream))


__all__ = [
    "Error", "FileError", "GemmError", "QuantError", "RecipeError", "device_to_host_copies",
    "GemmConfig", "GemmResult", "qgemm", "grouped_qgemm", "Model", "Learner", "Sampler",
    "export_policy", "rl_step", "QTensor", "quantize", "dequantize", "save_file", "load_file",
    "Recipe", "recipes", "align_stats", "grpo_advantages", "objective", "tis_weights",
    "triage_weights", "synchronize", "__version__",
]
