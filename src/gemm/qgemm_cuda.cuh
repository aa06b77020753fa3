// Device helpers shared by the CUDA GEMM kernels (qgemm_decode_cuda.cu, qgemm_tiled_cuda.cu):
// exact operand decoding into bf16 through the numerics/ codecs, the bf16 mma.sync wrapper and the
// epilogue of docs/gemm.md section 4. Internal to src/gemm.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "../tensor/cuda_launch.cuh"
#include "lockstep/numerics/block_rules.h"
#include "lockstep/numerics/codecs.h"
#include "lockstep/numerics/hd.h"
#include "lockstep/numerics/transcendental.h"
#include "qgemm_cuda_types.h"

namespace lockstep::cuda::gemm_detail {

// Error messages without fmt (fmt's consteval format strings do not compile under nvcc).
template <class... T>
std::string cat(const T&... x) {
  std::ostringstream os;
  (os << ... << x);
  return os.str();
}

// Programmatic dependent launch (launch_pdl, pdl_wait, pdl_launch_dependents):
// tensor/cuda_launch.cuh.
// Split cluster barrier (every thread of every block of the cluster, warp-uniform).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// bf16 bits of a value that is exactly a bf16 (every inner value the kernels build is: docs/gemm.md
// section 2); RNE otherwise, which the host wrappers rule out before launching.
__device__ __forceinline__ uint16_t bf16_bits(float v) { return num::f32_to_bf16(v); }

// Element code -> inner element value (no block scale), by the contract's codecs.
__device__ __forceinline__ float decode_elem(Format f, ElemCodec e, uint32_t code) {
  if (f == Format::kNvfp4) return num::decode_e2m1(uint8_t(code));
  return e == ElemCodec::kE5M2 ? num::decode_e5m2(uint8_t(code)) : num::decode_e4m3(uint8_t(code));
}

// Block scale code -> its value (nvfp4 E4M3, mxfp8 E8M0); 1 for formats without block scales.
__device__ __forceinline__ float decode_block_scale(Format f, uint8_t code) {
  if (f == Format::kNvfp4) return num::decode_e4m3(code);
  if (f == Format::kMxfp8) return num::decode_e8m0(code);
  return 1.0f;
}

// The inner value of operand element (r, k) as bf16 bits (scalar path: A staging, tails).
__device__ __forceinline__ uint16_t inner_bf16(const GemmOperandView& op, int64_t r, int64_t k) {
  const int64_t K = op.cols;
  switch (op.format) {
    case Format::kBf16:
      return static_cast<const uint16_t*>(op.data)[r * K + k];
    case Format::kNvfp4: {
      const uint8_t byte = static_cast<const uint8_t*>(op.data)[(r * K + k) >> 1];
      const uint8_t code = (k & 1) ? (byte >> 4) : (byte & 0xF);
      return bf16_bits(num::mul_rn(num::decode_e2m1(code),
                                   num::decode_e4m3(op.block_scale[r * (K / 16) + k / 16])));
    }
    case Format::kMxfp8: {
      const uint8_t code = static_cast<const uint8_t*>(op.data)[r * K + k];
      return bf16_bits(num::mx_dequant(decode_elem(op.format, op.elem, code),
                                       op.block_scale[r * (K / 32) + k / 32]));
    }
    case Format::kFp8:
    default:
      return bf16_bits(
          decode_elem(op.format, op.elem, static_cast<const uint8_t*>(op.data)[r * K + k]));
  }
}

__device__ __forceinline__ float outer_of(const GemmOperandView& op, int64_t r) {
  return op.outer ? op.outer[r] : 1.0f;
}

// Lookup tables in shared memory, filled by the block from the codecs (never re-derived):
//   pair[b]  = bf16x2 {elem(b & 15), elem(b >> 4)} for nvfp4, {elem(b), 0} for 8-bit codes;
//   scale[b] = bf16 bits of the block scale code b (E4M3 for nvfp4, E8M0 = 2^(b-127) for mxfp8).
__device__ __forceinline__ uint32_t pair_entry(Format f, ElemCodec e, uint32_t b) {
  if (f == Format::kNvfp4)
    return uint32_t(bf16_bits(decode_elem(f, e, b & 15))) |
           (uint32_t(bf16_bits(decode_elem(f, e, b >> 4))) << 16);
  if (f == Format::kBf16) return 0;
  return uint32_t(bf16_bits(decode_elem(f, e, b)));
}
__device__ __forceinline__ uint16_t scale_entry(Format f, uint32_t b) {
  return bf16_bits(decode_block_scale(f, uint8_t(b)));
}

// Exact bf16x2 product (both factors and the product are bf16 numbers: docs/gemm.md section 2).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a);
  __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 z = __hmul2(x, y);
  return *reinterpret_cast<uint32_t*>(&z);
}

// D[16x8] += A[16x16] B[16x8], bf16 inputs, fp32 accumulators (PTX fragment layouts).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Streaming 16-byte load of packed weights (read once: do not pollute L1).
__device__ __forceinline__ uint4 ldg_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Epilogue steps 1-3 of docs/gemm.md section 4 for one element before SwiGLU:
// v = RN(v0 + bias) with v0 = RN(alpha * RN(RN(oa * ow) * acc)).
__device__ __forceinline__ float epilogue_value(float acc, float oa, float ow,
                                                const DeviceEpilogue& ep, int64_t bias_idx) {
  const float d = num::mul_rn(num::mul_rn(oa, ow), acc);
  float v = num::mul_rn(ep.alpha, d);
  if (ep.bias) v = num::add_rn(v, ep.bias[bias_idx]);
  return v;
}

__device__ __forceinline__ void store_out(const GemmOutView& out, int64_t idx, float y) {
  if (out.d_bf16)
    out.d_bf16[idx] = num::f32_to_bf16(y);
  else
    out.d_f32[idx] = y;
}

// Raw fp32 D (or K-slice partials) -> output: sums `slices` partials [slices][rows_total][n] in
// ascending slice order, applies outer scales and the epilogue (SwiGLU included). grid: x over
// output columns, y over rows of a group, z over groups.
void launch_epilogue(const float* ws, int slices, int64_t rows_total, const GemmOperandView& a,
                     const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                     const DeviceEpilogue& ep, GemmOutView out, cudaStream_t stream);

// block_split: split K in whole blocks wherever their shared memory fits (GemmVariant::
// kDecodeBlockSplit; by default only where clusters would take more than one wave).
void launch_decode(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                   const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                   bool block_split, cudaStream_t stream);
void launch_tiled(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                  const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                  Scratch& scratch, cudaStream_t stream);

// ---- operand tiles shared by the tiled and wgmma kernels ------------------------------------
// One operand's raw bytes for one thread's 16 k-values of one row (prefetched into registers).
struct RawTile {
  uint4 v[2];
  uint32_t scale;
  bool valid;
};

struct OperandLuts {
  uint32_t pair[256];
  uint16_t scale[256];
};

// Thread `tid` covers row tid / 2 and k [16 * (tid & 1), +16) of a 128 x 32 tile.
__device__ __forceinline__ void load_raw(const GemmOperandView& op, int64_t row, bool valid,
                                         int64_t k, RawTile& r) {
  r.valid = valid;
  r.v[0] = r.v[1] = make_uint4(0, 0, 0, 0);
  r.scale = 0;
  if (!valid) return;
  const int64_t K = op.cols;
  const uint8_t* d = static_cast<const uint8_t*>(op.data);
  switch (op.format) {
    case Format::kBf16: {
      const uint4* p = reinterpret_cast<const uint4*>(d + (row * K + k) * 2);
      r.v[0] = __ldg(p);
      r.v[1] = __ldg(p + 1);
      break;
    }
    case Format::kNvfp4: {
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(d + (row * K + k) / 2));
      r.v[0].x = x.x, r.v[0].y = x.y;
      r.scale = __ldg(op.block_scale + row * (K / 16) + k / 16);
      break;
    }
    default:
      r.v[0] = __ldg(reinterpret_cast<const uint4*>(d + row * K + k));
      if (op.format == Format::kMxfp8) r.scale = __ldg(op.block_scale + row * (K / 32) + k / 32);
      break;
  }
}

// Exact bf16 of the 16 values (8 x bf16x2 words, k ascending), format known at compile time.
// `pair(b)` is the pair table entry of byte b (plain or lane-replicated table). With kOut = 4 only
// the first 8 values (the first half of r's bytes).
template <Format F, class Pair, int kOut>
__device__ __forceinline__ void dequant16_p(const Pair& pair, const uint16_t* scale,
                                            const RawTile& r, uint32_t (&o)[kOut]) {
  static_assert(kOut == 8 || kOut == 4, "16 or 8 values");
  if constexpr (F == Format::kBf16) {
    const uint32_t* s = reinterpret_cast<const uint32_t*>(r.v);
#pragma unroll
    for (int i = 0; i < kOut; ++i) o[i] = s[i];
  } else if constexpr (F == Format::kNvfp4) {
    const uint32_t sc = uint32_t(scale[r.scale]) * 0x10001u;
    const uint32_t w[2] = {r.v[0].x, r.v[0].y};
#pragma unroll
    for (int i = 0; i < kOut; ++i) o[i] = bf16x2_mul(pair((w[i >> 2] >> ((i & 3) * 8)) & 0xFF), sc);
  } else {
    const uint32_t w[4] = {r.v[0].x, r.v[0].y, r.v[0].z, r.v[0].w};
#pragma unroll
    for (int i = 0; i < kOut; ++i) {
      const uint32_t q = w[i >> 1] >> ((i & 1) * 16);
      o[i] = __byte_perm(pair(q & 0xFF), pair((q >> 8) & 0xFF), 0x5410);
    }
    if constexpr (F == Format::kMxfp8) {
      const uint32_t sc = uint32_t(scale[r.scale]) * 0x10001u;
#pragma unroll
      for (int i = 0; i < kOut; ++i) o[i] = bf16x2_mul(o[i], sc);
    }
  }
}

template <Format F>
__device__ __forceinline__ void dequant16_f(const OperandLuts& lut, const RawTile& r,
                                            uint32_t (&o)[8]) {
  dequant16_p<F>([&](uint32_t b) { return lut.pair[b]; }, lut.scale, r, o);
}

// The same with the format read at run time; an invalid (out of range) piece is zero.
__device__ __forceinline__ void dequant16(const GemmOperandView& op, const OperandLuts& lut,
                                          const RawTile& r, uint32_t (&o)[8]) {
  switch (r.valid ? op.format : Format::kBf16) {  // load_raw zeroes invalid pieces
    case Format::kNvfp4:
      dequant16_f<Format::kNvfp4>(lut, r, o);
      break;
    case Format::kMxfp8:
      dequant16_f<Format::kMxfp8>(lut, r, o);
      break;
    case Format::kFp8:
      dequant16_f<Format::kFp8>(lut, r, o);
      break;
    default:
      dequant16_f<Format::kBf16>(lut, r, o);
      break;
  }
}

// dequant16 into 32 contiguous bytes of shared memory.
__device__ __forceinline__ void store_tile(const GemmOperandView& op, const OperandLuts& lut,
                                           const RawTile& r, uint16_t* dst) {
  uint32_t o[8];
  dequant16(op, lut, r, o);
  uint4* d4 = reinterpret_cast<uint4*>(dst);
  d4[0] = make_uint4(o[0], o[1], o[2], o[3]);
  d4[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// Shared by the tiled and wgmma launchers: the row-tile count must fit gridDim.y, and a SwiGLU
// epilogue (pairing columns c and N/2 + c, which live in different tiles) needs the fp32 results
// in scratch first; returns that buffer, or nullptr without SwiGLU.
inline float* tile_grid_checks(const char* kernel, int bm, const DeviceGroupTable& groups,
                               int64_t n, const DeviceEpilogue& ep, Scratch& scratch) {
  if ((groups.max_rows + bm - 1) / bm > 65535)
    throw GemmError(cat("qgemm ", kernel, " kernel: ", groups.max_rows,
                        " rows per group is too many (max ", int64_t(65535) * bm, ")"));
  if (!ep.swiglu) return nullptr;
  return scratch.get<float>(size_t(groups.total_rows) * size_t(n));
}

// The Hopper wgmma kernel (qgemm_wgmma_cuda.cu): usable when the GPU is sm_90 and K % 64 == 0.
bool wgmma_supported(int64_t k);
// Runs one of the four wgmma kernels: `route` kWgmma chooses by format and rows per group;
// kWgmmaInloop / Staged / Wreg128 / Wreg256 / SmallM / SmallMWide ask for one, which runs wherever
// its operands allow it (else the choice falls back as for kWgmma: every variant gives the same
// bits). Returns the variant that ran.
GemmVariant launch_wgmma(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                         const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                         Scratch& scratch, GemmVariant route, cudaStream_t stream);

// The Hopper wgmma kernel over bf16 operands fed by TMA (qgemm_wgmma_tma_cuda.cu): packed operands
// are first dequantized into bf16 copies in scratch. Same chain as launch_wgmma (bit-identical
// output, tested); launch_wgmma calls it when staged_wgmma_usable and (forced, or
// staged_wgmma_preferred: the copies pay off).
bool staged_wgmma_usable(const GemmOperandView& a, const GemmOperandView& w);
bool staged_wgmma_preferred(const GemmOperandView& a, const GemmOperandView& w,
                            const DeviceGroupTable& groups);
void launch_wgmma_staged(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                         const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                         Scratch& scratch, cudaStream_t stream);

// The Hopper wgmma kernel with packed nvfp4 W decoded inside the kernel (qgemm_wgmma_wreg_cuda.cu):
// no bf16 copy of W, a packed A is dequantized into a bf16 copy in scratch. Same chain as
// launch_wgmma (bit-identical output, tested). wreg_wgmma_tile: its A-tile height (128 or 256) when
// launch_wgmma should run it (nvfp4 W with 16-byte aligned codes and 4-byte aligned scales; 128 to
// 2047 rows per group, or asked for by `route`), else 0.
int wreg_wgmma_tile(const GemmOperandView& a, const GemmOperandView& w,
                    const DeviceGroupTable& groups, GemmVariant route);
void launch_wgmma_wreg(int tile, const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                       const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                       Scratch& scratch, cudaStream_t stream);

// The small-M wgmma kernel (qgemm_wgmma_smallm_cuda.cu): 64 x 32 or 64 x 128 tiles, one
// warpgroup, the chain of the other wgmma kernels (bit-identical output, tested). It takes any M
// (64-row tiles); launch_wgmma runs it when asked for, or, choosing itself, when
// smallm_wgmma_preferred: at most kSmallMMaxRows rows per group (the rule is in the .cu). `route`
// kWgmmaSmallM / kWgmmaSmallMWide asks for a tile width, any other lets the .cu choose (128
// columns once their tiles give every SM two or more). Returns the variant (width) that ran.
constexpr int64_t kSmallMMaxRows = 64;
bool smallm_wgmma_preferred(const DeviceGroupTable& groups, int64_t n);
GemmVariant launch_wgmma_smallm(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                                const DeviceGroupTable& groups, const DeviceEpilogue& ep,
                                GemmOutView out, Scratch& scratch, GemmVariant route,
                                cudaStream_t stream);

// bf16 inner values of `op` [rows, K] written to `scratch` (the data pointer itself for bf16
// operands): the tiles' exact decode, one pass (qgemm_cublas_cuda.cu).
const uint16_t* dequantized(const GemmOperandView& op, uint16_t* scratch, cudaStream_t stream);
// Bytes of `scratch` that dequantized() needs for `op` (0 for bf16), rounded up to 256 so that
// buffers laid out back to back stay aligned.
inline size_t bf16_copy_bytes(const GemmOperandView& op) {
  return op.format == Format::kBf16 ? 0 : (size_t(op.rows) * size_t(op.cols) * 2 + 255) / 256 * 256;
}

// The cuBLAS fast path (qgemm_cublas_cuda.cu); needs the host copy of the group table.
void launch_cublas(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                   const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                   Scratch& scratch, cudaStream_t stream);

constexpr int kDecodeMaxRows = 16;  // rows per group the decode kernel takes
// Whether the decode kernel's shared memory (tables, the staged A slice) fits one block for this W
// format, K and rows per group (<= kDecodeMaxRows); the automatic choice falls back to the other
// kernels when it does not (nvfp4 W with 9-16 rows: K <= 48128; 8-bit W or <= 8 rows: larger).
bool decode_fits(Format w_format, int64_t K, int64_t max_rows);

}  // namespace lockstep::cuda::gemm_detail
