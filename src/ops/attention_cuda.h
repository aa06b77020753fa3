// Host launch functions of the CUDA attention and KV-cache kernels (private to ops/; compiled only
// with LOCKSTEP_HAVE_CUDA). Tensors are contiguous, F32 unless stated, on one CUDA device; work is
// queued on the thread's current stream and nothing waits for it (no host synchronisation, no
// device data read on the host), so a decode step can be captured in a CUDA graph.
#pragma once

#include <cstdint>

#include "lockstep/ops/attention.h"
#include "lockstep/ops/kv_cache.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::ops::attention_cuda {

// The kernel attention_cached runs: kWarp (one warp per (row, NH heads), chunks in order), kSplit
// (a block per (row, NH heads), its warps on consecutive chunks, the max and rescale steps chained
// in chunk order; for few rows), kAuto (chosen from rows and the shape). All give the same bits.
enum class CachedPath : uint8_t { kAuto, kWarp, kSplit };

// Packed forward, kRowwise (attention_row per (token, NH heads of a group)). cu: I32 / I64 [b + 1]
// on the device; out [T, Hq * D], lse [T, Hq].
void rowwise_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu,
                     const AttentionDims& dims, float scale, Tensor& out, Tensor& lse);

// Packed forward, kPrefill: the tensor-core flash kernel (docs/ops.md, "Attention on the GPU").
void prefill_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu,
                     const AttentionDims& dims, float scale, Tensor& out, Tensor& lse);

// Backward of either forward (from its out and lse): dq [T, Hq * D], dk, dv [T, Hkv * D].
void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& lse, const Tensor& dout, const Tensor& cu, const AttentionDims& dims,
              float scale, Tensor& dq, Tensor& dk, Tensor& dv);

// x [rows, Hkv * D] rounded in place by the cache rule.
void kv_round(Tensor& x, int64_t kv_heads, int64_t head_dim, KvDtype dtype);

// Rows of k_rows / v_rows [rows, Hkv * D] into the cache at (slots[r], positions[r]) (I32 / I64 on
// the device; a row with an index out of range is skipped).
void kv_cache_write(const KvCacheView& cache, const Tensor& k_rows, const Tensor& v_rows,
                    const Tensor& slots, const Tensor& positions);

// The cached step's prologue (ops::cached_qkv_prologue): q [tokens, Hq * D] from qkv [tokens,
// (Hq + 2 Hkv) * D] (rmsnorm with q_w, rope), K (rmsnorm with k_w, rope) and V into the cache at
// (slots[t], positions[t]); positions I32, slots I32 / I64 on the device; cos / sin [rope_max_pos,
// D]. A position outside the table gives NaN rows; out-of-range cache indices store nothing.
void cached_qkv_prologue(const KvCacheView& cache, const Tensor& qkv, const Tensor& q_w,
                         const Tensor& k_w, float eps, const Tensor& positions, const Tensor& slots,
                         const Tensor& cos, const Tensor& sin, int64_t rope_max_pos,
                         int64_t q_heads, Tensor& q);

// out [rows, Hq * D] F32 or BF16 (and lse [rows, Hq] when lse is defined) of q [rows, Hq * D]
// against the cache. nh: query heads per row call (0: the largest of attention_row_heads that keeps
// the GPU busy; else 1, 2, 4 or 8 dividing Hq / Hkv).
void attention_cached(const Tensor& q, const KvCacheView& cache, const Tensor& slots,
                      const Tensor& positions, int64_t q_heads, float scale, Tensor& out,
                      Tensor* lse, CachedPath path = CachedPath::kAuto, int nh = 0);

}  // namespace lockstep::ops::attention_cuda
