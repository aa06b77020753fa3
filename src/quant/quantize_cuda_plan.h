// Host planning of the CUDA quantizers, private to src/quant: the call's context (device, stream,
// scratch, group offsets on the device), device tensors as kernel inputs, and the passes shared by
// the rowwise (quantize_cuda_host.cpp) and columnwise (quantize_colwise_cuda_host.cpp) copies.
// Everything is ordered on the call's stream; nothing waits for the device.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../tensor/cuda_util.h"
#include "lockstep/quant/quantize.h"
#include "quantize_cuda_params.h"

namespace lockstep::cuda::plan {

using detail::InputRef;

// A 2-D device tensor as the kernels read it: contiguous F32 or BF16 rows.
struct Input {
  InputRef ref;
  int64_t rows = 0, cols = 0;
  float type_max = 0.0f;  // the largest finite value of the source dtype (FP8 scale fallback)
};
// Throws QuantError naming the tensor unless x is a contiguous 2-D F32 / BF16 device tensor.
Input input_of(const Tensor& x, std::string_view name);

// One call: its device and stream, scratch memory, and the group offsets (host and device; one
// group {0, rows} for an ungrouped tensor).
class Ctx {
 public:
  Ctx(Device d, Stream s, std::span<const int64_t> offsets, int64_t rows);
  Device dev;
  Stream st;
  cudaStream_t cs;
  Scratch scratch;
  bool grouped;
  std::vector<int64_t> off;  // groups + 1 host offsets
  int64_t groups() const { return int64_t(off.size()) - 1; }
  // The offsets on the device (uploaded on first use).
  const int64_t* d_off();
  // The row bands of the columnwise tile kernels and their count, and the 128-row blocks before
  // each group (groups + 1 entries; FP8 1x128 column scales), on the device and on the host. The
  // first of these uploads them with the offsets in one launch (upload_words).
  const detail::RowBand* bands();
  int64_t nbands();
  const int64_t* d_sbase();
  const std::vector<int64_t>& sbase();

  Tensor u8(std::vector<int64_t> shape) const {
    return Tensor::empty(DType::kU8, std::move(shape), dev, st);
  }
  Tensor f32(std::vector<int64_t> shape) const {
    return Tensor::empty(DType::kF32, std::move(shape), dev, st);
  }
  uint32_t* zero_keys(int64_t n);  // scratch amax keys, zeroed

 private:
  void upload_tile_meta();
  Tensor d_off_, d_meta_;
  const int64_t* d_off_p_ = nullptr;
  const int64_t* d_sbase_p_ = nullptr;
  const detail::RowBand* d_bands_p_ = nullptr;
  std::vector<detail::RowBand> bands_;
  std::vector<int64_t> sbase_;
  bool bands_made_ = false;
};

detail::SrParams sr_of(const QuantConfig& c);
float elem_max_of(const QuantConfig& c);
// Block scales [srows, scols] of a copy in `layout` (swizzled: 1-D, padded, zero-filled).
Tensor alloc_scales(Ctx& c, int64_t srows, int64_t scols, ScaleLayout layout);
detail::ScaleOut scale_out(Tensor& t, int64_t scols, ScaleLayout layout);

// The Hadamard transform of x along its rows or down its columns (16-row chunks), into bf16
// scratch (the transform's output is bf16 by definition, so the copy is exact).
Input hadamard_rows_into(Ctx& c, const Input& x);
Input hadamard_cols_into(Ctx& c, const Input& x);

// A domain amax pass over x (kDomTensor, kDomGroup or kDomTile128 with ndom domains) into fresh
// keys, unless `keys` are given (joint quantization), then the finishing kernel with `f` (its
// keys, dom_val and offsets are filled in here). Returns dom_val (scratch): the amax per domain
// (NVFP4) or the scale (FP8, f.fp8).
float* domain_pass(Ctx& c, const Input& x, int kind, int64_t ndom, int64_t tile_cols,
                   detail::FinishParams f, const uint32_t* keys = nullptr);
// The column amax of each group (domain g * cols + c), then the finishing kernel with `f`.
float* column_pass(Ctx& c, const Input& x, detail::FinishParams f);

// What the rowwise planning hands to the columnwise one.
struct RowwiseInfo {
  const float* dom_amax = nullptr;  // NVFP4 per tensor / per group: the rowwise A per domain
  bool same_values = false;         // the rowwise A was taken over x itself (no Hadamard)
  bool col2d_written = false;       // NVFP4 2-D: the rowwise kernel wrote the columnwise copy too
};
// The parts of an NVFP4 transposed columnwise copy (CONTRACT.md section 12), allocated: data
// [cols, rows / 2] and block scales [cols, rows / 16] (per-group pieces, 1-D, when grouped).
void alloc_nvfp4_colwise(Ctx& c, int64_t rows, int64_t cols, const QuantConfig& cfg, QData& o);
// NVFP4 columnwise copy (1-D: the quantization of each X_g^T; 2-D: the transpose of q.rowwise,
// which holds the rowwise copy already). joint_keys: the shared key of a joint quantization.
void nvfp4_colwise(Ctx& c, const Input& x, const QuantConfig& cfg, QTensor& q,
                   const RowwiseInfo& ri, const uint32_t* joint_keys = nullptr,
                   bool joint_nonempty = false);
// NVFP4 per tensor / per group, 1-D blocks, no Hadamard transform: both copies from one read of x
// after the domain amax pass (the two copies share A).
void nvfp4_both_one_read(Ctx& c, const Input& x, const QuantConfig& cfg, QTensor& q,
                         const uint32_t* joint_keys, bool joint_nonempty);
// FP8 rowwise copy into o (row kernels; per tensor / group / 128x128 after a domain amax pass).
void fp8_rowwise(Ctx& c, const Input& x, const QuantConfig& cfg, QData& o);
// FP8 with a columnwise copy: both copies (the rowwise one when cfg.rowwise) into q.
void fp8_with_colwise(Ctx& c, const Input& x, const QuantConfig& cfg, QTensor& q);

}  // namespace lockstep::cuda::plan
