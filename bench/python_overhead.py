"""The Python binding's overhead on the GPU: lockstep.quantize on a 16384 x 8192 bf16 CUDA tensor
called from Python against the same lockstep::quantize calls made from a C++ loop inside the
extension (_lockstep._time_quantize_cpp), both on the caller's current stream. Each measurement
is `iters` back-to-back calls ended by one synchronize (what a training step sees: launches
queue while the GPU works), the median of `repeats` alternating measurements; the input (268 MB)
is far past L2. Target: Python / C++ <= 1.05. The table is printed last; --json PATH writes it.

Usage: PYTHONPATH=BUILD/python python3 bench/python_overhead.py [--iters 50] [--repeats 15]
       [--rows 16384 --cols 8192] [--device cuda|cpu] [--json out.json]
"""
import argparse
import json
import statistics
import sys
import time

import torch

import lockstep
from lockstep import _lockstep

CONFIGS = [("nvfp4", "per_row"), ("nvfp4", "per_tensor"), ("mxfp8", "block_1x32"),
           ("fp8", "per_tensor")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.device == "cuda" and not (torch.cuda.is_available() and lockstep.cuda_compiled):
        print("python_overhead: needs a CUDA device and a CUDA build of lockstep", file=sys.stderr)
        return 2
    x = torch.randn(a.rows, a.cols, device=a.device).to(torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream if a.device == "cuda" else 0
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    rows = []
    for fmt, scaling in CONFIGS:
        for _ in range(3):  # warm-up: pools, module loading
            lockstep.quantize(x, fmt, scaling)
            _lockstep._time_quantize_cpp(x, fmt, scaling, 2, stream)
        sync()
        py, py_parts, cpp = [], [], []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            for _ in range(a.iters):
                q = lockstep.quantize(x, fmt, scaling)
            sync()
            py.append((time.perf_counter() - t0) / a.iters)
            del q
            t0 = time.perf_counter()
            for _ in range(a.iters):
                q = lockstep.quantize(x, fmt, scaling)
                q.data, q.block_scale, q.amax, q.scale_inv  # every part as a torch tensor
            sync()
            py_parts.append((time.perf_counter() - t0) / a.iters)
            del q
            cpp.append(_lockstep._time_quantize_cpp(x, fmt, scaling, a.iters, stream))
        m_py, m_parts, m_cpp = (statistics.median(v) for v in (py, py_parts, cpp))
        moved = x.numel() * 2 + (x.numel() // 2 if fmt == "nvfp4" else x.numel())
        rows.append({"format": fmt, "scaling": scaling, "shape": [a.rows, a.cols],
                     "cpp_us": m_cpp * 1e6, "python_us": m_py * 1e6,
                     "python_with_parts_us": m_parts * 1e6, "ratio": m_py / m_cpp,
                     "ratio_with_parts": m_parts / m_cpp, "cpp_GBps": moved / m_cpp / 1e9})
    print(f"\nlockstep.quantize overhead, {a.rows} x {a.cols} bf16 on {a.device} "
          f"({torch.cuda.get_device_name() if a.device == 'cuda' else 'cpu'}), "
          f"median of {a.repeats} x {a.iters} calls")
    print(f"{'format':<8} {'scaling':<11} {'C++ us':>9} {'Python us':>10} {'ratio':>6} "
          f"{'+parts us':>10} {'ratio':>6} {'C++ GB/s':>9}  target <= 1.05")
    for r in rows:
        ok = "ok" if r["ratio"] <= 1.05 else "OVER"
        print(f"{r['format']:<8} {r['scaling']:<11} {r['cpp_us']:9.1f} {r['python_us']:10.1f} "
              f"{r['ratio']:6.3f} {r['python_with_parts_us']:10.1f} {r['ratio_with_parts']:6.3f} "
              f"{r['cpp_GBps']:9.0f}  {ok}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
