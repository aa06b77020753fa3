// Kernel parameter blocks and launch functions of the CUDA quantizers: plain structs (raw device
// pointers plus sizes) shared by the host planning code (quantize_cuda_host.cpp,
// quantize_colwise_cuda_host.cpp, built by the host compiler) and the kernels (*.cu). Not a public
// header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lockstep/numerics/hd.h"
#include "lockstep/quant/format.h"
#include "lockstep/quant/scale_access.h"

namespace lockstep::cuda::detail {

struct SrParams {
  bool on = false;
  uint64_t seed = 0;
  uint32_t stream = 0;
};

// Block scales written by the kernels: compact or swizzled (scale_access.h, shared with the CPU).
using ScaleOut = ScaleView;

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
  bool tensor_nonempty = false;  // per tensor / joint / tiles
  bool fp8 = false;
  float elem_max = 448.0f, eps = 0.0f, type_max = 0.0f;
  bool pow2 = false;
  float* dom_val = nullptr;        // amax (NVFP4) or scale (FP8) per domain
  float* amax_out = nullptr;       // NVFP4 stored amax per domain
  float* scale_inv_out = nullptr;  // FP8 stored scale_inv per domain
  // Column domains (columnwise per_row): domain d is column d % dom_cols of group d / dom_cols,
  // non-empty iff that group has rows. 0: domains are groups (offsets) or one tensor.
  int64_t dom_cols = 0;
};

// ---- columnwise copies (CONTRACT.md section 12) ------------------------------------------------
// Column amax per group: keys[g * cols + c] = max amax_key over rows of group g in column c.
struct ColAmaxParams {
  int64_t rows = 0, cols = 0;
  int nchunks = 0;                   // ceil(cols / 16)
  const int64_t* offsets = nullptr;  // groups + 1 entries (one group: {0, rows})
  int64_t groups = 1;
  uint32_t* keys = nullptr;
};
constexpr int kColAmaxRowsPerWarp = 128;

// A band of at most kColTileRows rows of one group: tiles of the columnwise kernels never straddle
// a group (their blocks down the columns restart at each group's first row).
struct RowBand {
  int64_t row0 = 0;
  int32_t nrows = 0;
  int32_t group = 0;
};
constexpr int kColTileRows = 128, kColTileCols = 128;

enum class ColMode : int {
  kNvfp4,         // NVFP4 1-D columnwise copy: blocks of 16 down each column, amax per domain given
  kFp8Block,      // FP8 1x128: the rowwise copy (optional) and the columnwise copy from one read
  kFp8Col,        // FP8 per_row columnwise copy: the scale of each (group, column) given
  kFp8Transpose,  // FP8 domain scales: rowwise codes (optional) and their transpose
};

struct ColTileParams {
  int64_t rows = 0, cols = 0;
  const RowBand* bands = nullptr;
  const int64_t* offsets = nullptr;  // group offsets on the device (one group: {0, rows})
  int64_t groups = 1;
  // Rowwise copy (kFp8Block, kFp8Transpose); data == nullptr: not written.
  uint8_t* data = nullptr;
  float* scale_inv = nullptr;  // kFp8Block: [rows, tile_cols]
  int64_t tile_cols = 0;       // ceil(cols / 128)
  int dom_kind = 0;            // kFp8Transpose: kDomTensor / kDomGroup / kDomTile128
  const float* dom_val = nullptr;
  // Columnwise copy: group g's piece is X_g^T [cols, rows_g] starting at element cols * offsets[g].
  uint8_t* data_col = nullptr;
  uint8_t* scale_col = nullptr;        // NVFP4 block scales: group pieces [cols, rows_g / 16]
  bool scale_col_swizzled = false;     // ungrouped only: [cols, rows / 16] swizzled
  float* scale_inv_col = nullptr;      // kFp8Block: group pieces [cols, ceil(rows_g / 128)]
  const int64_t* col_sbase = nullptr;  // kFp8Block: piece g starts at cols * col_sbase[g]
  const float* col_val = nullptr;      // kNvfp4: amax per domain; kFp8Col: scale per (g, c)
  int col_dom = 0;                     // kNvfp4: 0 per tensor, 1 per group, 2 per (group, column)
  // kNvfp4 with per tensor / per group scaling and no Hadamard transform: the rowwise copy from the
  // same read (its A per domain is col_val's), when data_row != nullptr.
  uint8_t* data_row = nullptr;
  ScaleOut scale_row;
  float elem_max = 448.0f, eps = 0.0f, type_max = 0.0f;
  bool pow2 = false, e5m2 = false;
  SrParams sr;
};

// NVFP4 2-D columnwise copy: the transpose of the rowwise codes and 16x16 tile scales.
struct Nvfp4TransposeParams {
  int64_t rows = 0, cols = 0;
  const RowBand* bands = nullptr;
  const int64_t* offsets = nullptr;
  const uint8_t* data = nullptr;  // rowwise [rows, cols / 2]
  ScaleOut scale;                 // rowwise scales [rows, cols / 16]
  uint8_t* data_col = nullptr;    // group pieces [cols, rows_g / 2]
  uint8_t* scale_col = nullptr;  // group pieces [cols, rows_g / 16] (swizzled when ungrouped + swz)
  bool scale_col_swizzled = false;
};

// Dequantize of a transposed columnwise copy (NVFP4 / FP8) back to X [rows, cols].
struct DequantColParams {
  int64_t rows = 0, cols = 0;
  Format format = Format::kNvfp4;
  Scaling scaling = Scaling::kPerTensor;
  bool block2d = false, e5m2 = false;
  const int64_t* offsets = nullptr;  // one group: {0, rows}
  int64_t groups = 1;
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;
  bool scale_swizzled = false;
  const float* amax = nullptr;         // NVFP4
  const float* scale_inv = nullptr;    // FP8
  const int64_t* col_sbase = nullptr;  // FP8 1x128: blocks before group g
  float* out_f32 = nullptr;
  uint16_t* out_bf16 = nullptr;
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
  // Both copies from one read (launch_nvfp4_2d_both): the row bands (offsets set) and the
  // columnwise copy, laid out as Nvfp4TransposeParams' outputs.
  const RowBand* bands = nullptr;
  int64_t nbands = 0;
  uint8_t* data_col = nullptr;
  uint8_t* scale_col = nullptr;
  bool scale_col_swizzled = false;
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
  float* out_f32 = nullptr;  // exactly one of out_f32 / out_bf16 (RNE of the fp32 value)
  uint16_t* out_bf16 = nullptr;
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
// keys[i] = the domain key (amax_key) of the amax value a[i], for amax values given by a caller.
void launch_amax_keys(const float* a, uint32_t* keys, int64_t n, cudaStream_t st);
void launch_rows(const InputRef& in, RowFmt f, const RowParams& p, cudaStream_t st);
// Producer fusions, NVFP4 rows: gather (output row r = input row src[r], -1 = zero row) and
// weighted SwiGLU (in is the [rows, 2 * half] FC1 output, prob [rows]).
void launch_rows_gather(const InputRef& in, const int32_t* src, int64_t tokens, const RowParams& p,
                        cudaStream_t st);
void launch_rows_swiglu(const InputRef& in, const float* prob, int64_t half, const RowParams& p,
                        cudaStream_t st);
void launch_nvfp4_2d(const InputRef& in, const Nvfp4TileParams& p, cudaStream_t st);
void launch_mxfp8_tile(const InputRef& in, const MxTileParams& p, cudaStream_t st);
void launch_hadamard(const InputRef& in, int64_t rows, int64_t cols, void* out, bool out_bf16,
                     cudaStream_t st);
void launch_dequantize(const DequantParams& p, cudaStream_t st);

// Columnwise copies (quantize_colwise_cuda.cu).
void launch_col_amax(const InputRef& in, const ColAmaxParams& p, cudaStream_t st);
// Y = the Hadamard transform of each 16-row chunk down each column of x (rows % 16 == 0), bf16.
void launch_hadamard_cols(const InputRef& in, int64_t rows, int64_t cols, uint16_t* out,
                          cudaStream_t st);
void launch_col_tiles(const InputRef& in, ColMode mode, const ColTileParams& p, int64_t nbands,
                      cudaStream_t st);
void launch_nvfp4_transpose(const Nvfp4TransposeParams& p, int64_t nbands, cudaStream_t st);
// FP8 128x128 columnwise scales: group g's [nbc, rows_g / 128] piece = transpose of its rowwise
// tiles.
void launch_fp8_tile_scale_transpose(const float* scale_inv, int64_t rows, int64_t nbc,
                                     const int64_t* offsets, int64_t groups, float* out,
                                     cudaStream_t st);
void launch_dequantize_colwise(const DequantColParams& p, cudaStream_t st);
// The bf16 kernels of quantize_colwise_fast_cuda.cu (bf16 rows 16-byte aligned, cols % 8 == 0,
// round to nearest); false (nothing launched) where they do not apply.
bool launch_col_tiles_bf16(const InputRef& in, ColMode mode, const ColTileParams& p, int64_t nbands,
                           cudaStream_t st);
bool launch_col_amax_bf16(const InputRef& in, const ColAmaxParams& p, cudaStream_t st);
// NVFP4 16x16 blocks, both copies from one read of bf16 rows (quantize_nvfp4_2d_cuda.cu); false
// (nothing launched) where it does not apply.
bool launch_nvfp4_2d_both(const InputRef& in, const Nvfp4TileParams& p, cudaStream_t st);

}  // namespace lockstep::cuda::detail
