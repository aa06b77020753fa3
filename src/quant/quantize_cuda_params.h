// Kernel parameter blocks and launch functions of the CUDA quantizers: plain structs (raw device
// pointers plus sizes) shared by the host planning code (quantize_cuda_host.cpp, built by the host
// compiler) and the kernels (*.cu). Not a public header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lockstep/numerics/hd.h"
#include "lockstep/quant/format.h"

namespace lockstep::cuda::detail {

struct SrParams {
  bool on = false;
  uint64_t seed = 0;
  uint32_t stream = 0;
};

// Swizzled scale offset (CONTRACT.md section 7), as layout.h's swizzled_offset.
LOCKSTEP_HD inline int64_t swizzled_offset_d(int64_t r, int64_t c, int64_t padded_cols) {
  return ((r / 128 * (padded_cols / 4) + c / 4) * 32 + r % 32) * 16 + (r % 128) / 32 * 4 + c % 4;
}

struct ScaleOut {
  uint8_t* p = nullptr;
  int64_t cols = 0;         // compact scale columns
  int64_t padded_cols = 0;  // roundup(cols, 4) when swizzled
  bool swizzled = false;
  LOCKSTEP_HD inline void store(int64_t r, int64_t c, uint8_t code) const {
    p[swizzled ? swizzled_offset_d(r, c, padded_cols) : r * cols + c] = code;
  }
  LOCKSTEP_HD inline uint8_t load(int64_t r, int64_t c) const {
    return p[swizzled ? swizzled_offset_d(r, c, padded_cols) : r * cols + c];
  }
};

// Which outer domain a row belongs to.
enum DomKind : int { kDomTensor = 0, kDomGroup = 1, kDomTile128 = 2, kDomRow = 3 };

enum class RowFmt : int { kNvfp4, kMxfp8, kFp8 };
enum AmaxMode : int { kAmaxRow = 0, kAmaxDomain = 1, kAmaxLanes8 = 2 };
constexpr int kRegChunks = 4;

struct RowParams {
  int64_t rows = 0, cols = 0;
  int nchunks = 0;  // ceil(cols / 16)
  int amax_mode = kAmaxRow;
  // kAmaxDomain: dom_val[domain] is the domain's amax (NVFP4) or fp32 scale (FP8).
  int dom_kind = kDomTensor;
  const float* dom_val = nullptr;
  const int64_t* offsets = nullptr;
  int64_t groups = 0;
  int64_t tile_cols = 0;  // FP8 ceil(cols / 128)
  uint8_t* data = nullptr;
  ScaleOut scale;
  float* amax_out = nullptr;       // NVFP4 per row: A per row
  float* scale_inv_out = nullptr;  // FP8 per row [rows], 1x128 [rows, tile_cols]
  float elem_max = 6.0f, eps = 0.0f, type_max = 0.0f;
  bool pow2 = false, e5m2 = false;
  SrParams sr;
};

struct AmaxParams {
  int64_t rows = 0, cols = 0;
  int nchunks = 0;
  int dom_kind = kDomTensor;  // kDomTensor, kDomGroup or kDomTile128
  const int64_t* offsets = nullptr;
  int64_t groups = 0;
  int64_t tile_cols = 0;
  uint32_t* keys = nullptr;
};
constexpr int kAmaxRowsPerWarp = 32;

struct FinishParams {
  int64_t ndom = 0;
  const uint32_t* keys = nullptr;
  const int64_t* offsets = nullptr;  // groups: domain g is non-empty iff it has rows (and cols > 0)
  int64_t cols = 0;
  bool tensor_nonempty = false;      // per tensor / joint / tiles
  bool fp8 = false;
  float elem_max = 448.0f, eps = 0.0f, type_max = 0.0f;
  bool pow2 = false;
  float* dom_val = nullptr;          // amax (NVFP4) or scale (FP8) per domain
  float* amax_out = nullptr;         // NVFP4 stored amax per domain
  float* scale_inv_out = nullptr;    // FP8 stored scale_inv per domain
};

struct Nvfp4TileParams {
  int64_t rows = 0, cols = 0;
  int nchunks = 0;
  int dom_kind = kDomTensor;
  const float* dom_val = nullptr;  // amax per domain
  const int64_t* offsets = nullptr;
  int64_t groups = 0;
  uint8_t* data = nullptr;
  ScaleOut scale;
  SrParams sr;
};

struct MxTileParams {
  int64_t rows = 0, cols = 0;
  bool rowwise = true, colwise = true;
  float elem_max = 448.0f;
  bool e5m2 = false;
  uint8_t* data = nullptr;
  ScaleOut scale;
  uint8_t* data_col = nullptr;
  uint8_t* scale_col = nullptr;  // [rows / 32, cols] compact
  SrParams sr;
};

struct DequantParams {
  int64_t rows = 0, cols = 0;
  int64_t nchunks = 0;  // per row, ceil(cols / 16)
  Format format = Format::kNvfp4;
  Scaling scaling = Scaling::kPerTensor;
  bool e5m2 = false;
  bool colwise = false;
  const uint8_t* data = nullptr;
  ScaleOut scale;
  const uint8_t* scale_col = nullptr;
  const float* amax = nullptr;       // NVFP4
  const float* scale_inv = nullptr;  // FP8
  int64_t scale_inv_cols = 0;
  const int64_t* offsets = nullptr;
  int64_t groups = 0;
  float* out = nullptr;
};

// A [rows, cols] input in device memory: fp32 or bf16.
struct InputRef {
  const void* p = nullptr;
  bool bf16 = true;
  int64_t cols = 0;
};

// Launchers (each checks the launch). Rows kernels: one CTA per row.
void launch_domain_amax(const InputRef& in, const AmaxParams& p, cudaStream_t st);
void launch_finish(const FinishParams& p, cudaStream_t st);
void launch_fill_f32(float* p, int64_t n, float v, cudaStream_t st);
void launch_rows(const InputRef& in, RowFmt f, const RowParams& p, cudaStream_t st);
// Producer fusions, NVFP4 rows: gather (output row r = input row src[r], -1 = zero row) and
// weighted SwiGLU (in is the [rows, 2 * half] FC1 output, prob [rows]).
void launch_rows_gather(const InputRef& in, const int32_t* src, const RowParams& p, cudaStream_t st);
void launch_rows_swiglu(const InputRef& in, const float* prob, int64_t half, const RowParams& p, cudaStream_t st);
void launch_nvfp4_2d(const InputRef& in, const Nvfp4TileParams& p, cudaStream_t st);
void launch_mxfp8_tile(const InputRef& in, const MxTileParams& p, cudaStream_t st);
void launch_hadamard(const InputRef& in, int64_t rows, int64_t cols, void* out, bool out_bf16, cudaStream_t st);
void launch_dequantize(const DequantParams& p, cudaStream_t st);
// Every fp32 bit pattern through the fast and the reference encoders; counts mismatches per codec
// (E2M1, E4M3, E5M2) into mismatches[3] (device memory).
// Fill n bf16 values with a deterministic pseudo-normal sample (Philox words, sum of 4 uniforms).
void launch_fill_random_bf16(uint16_t* p, int64_t n, uint64_t seed, cudaStream_t st);
void launch_codec_check(unsigned long long* mismatches, cudaStream_t st);

}  // namespace lockstep::cuda::detail
