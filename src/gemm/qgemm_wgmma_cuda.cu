// The Hopper tensor-core CUDA GEMM (GemmVariant::kWgmmaInloop, sm_90a): 128 x 128 output tiles, two
// warpgroups of 64 rows, K walked from 0 to K in fixed 64-wide steps (four k16 wgmma steps each,
// ascending) with no split-K, so every output element's fp32 chain depends on K only:
// batch-invariant for every M, like the tiled kernel (but a different chain from it). The packed
// bytes of each step are copied by cp.async into a ring of shared-memory stages (as many steps in
// flight as fit), then dequantized exactly into bf16 (the tiles' decode of qgemm_cuda.cuh, with
// lane-replicated tables) into two 128-byte-swizzled tiles; the dequantization of step k + 1 runs
// while the asynchronous wgmma of step k does. Formats are template parameters. Outer scales and
// the epilogue are applied last, as everywhere.
#include <cstdlib>
#include <string>

#include "qgemm_cuda.cuh"
#include "qgemm_wgmma_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kBM = 128, kBK = 64;
constexpr int kThreads = 256;
constexpr int kRowBytes = kBK * 2;  // 128 B: one swizzle row

// ---- raw stages: packed bytes of one 64-wide k step of the A and W tiles, copied with cp.async
// (stages - 1 steps in flight: as many as fit, since packed steps are small and the latency
// under load is long), then dequantized from shared memory into the swizzled bf16 tiles.
constexpr int kSmemBudget = 227 * 1024;

__device__ __forceinline__ void cp_async(void* dst, const void* src, int src_bytes,
                                         int bytes_const16) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  if (bytes_const16 == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Bytes of one tile row's 64 k-values, and the elements one block scale covers (0: none).
constexpr int raw_row_bytes(Format f) {
  return f == Format::kNvfp4 ? 32 : f == Format::kBf16 ? 128 : 64;
}
constexpr int scale_block(Format f) {
  return f == Format::kNvfp4 ? 16 : f == Format::kMxfp8 ? 32 : 0;
}
// Raw stage of one operand tile: [rows][row bytes] data, then [rows][4] scale words.
constexpr int raw_tile_bytes(Format f, int rows) {
  return rows * raw_row_bytes(f) + (scale_block(f) ? rows * 4 : 0);
}

// Issue the cp.async copies of tile rows [0, kRows) (global rows row0 + r, valid below `valid`)
// for k in [k0, k0 + 64). Rows past `valid` are zero-filled. A block-scale word is the aligned 4
// bytes holding the row's scales (nvfp4: exactly its 4; mxfp8: its 2 at byte (offset & 3)).
template <Format F, int kRows>
__device__ __forceinline__ void issue_raw(const GemmOperandView& op, int64_t row0, int64_t valid,
                                          int64_t k0, uint8_t* dst, int tid) {
  constexpr int rb = raw_row_bytes(F), cpr = rb / 16, sb = scale_block(F);
  static_assert((kRows * cpr) % kThreads == 0, "whole cp.async rounds");
  const int64_t K = op.cols;
  const uint8_t* base = static_cast<const uint8_t*>(op.data);
  const int64_t row_stride = K * rb / 64, k_off = k0 * rb / 64;
#pragma unroll
  for (int j = 0; j < kRows * cpr / kThreads; ++j) {
    const int i = tid + j * kThreads, r = i / cpr, c = i % cpr;
    const bool ok = r < valid;
    cp_async(dst + r * rb + c * 16, base + (row0 + (ok ? r : 0)) * row_stride + k_off + c * 16,
             ok ? 16 : 0, 16);
  }
  if constexpr (sb != 0) {
    uint8_t* sdst = dst + kRows * rb;
    const int64_t spr = K / sb, total = op.rows * spr;
#pragma unroll
    for (int r = tid; r < kRows; r += kThreads) {
      const bool ok = r < valid;
      const int64_t off = (row0 + (ok ? r : 0)) * spr + k0 / sb, al = off & ~int64_t(3);
      if (ok && al + 4 > total) {  // the last word of the buffer: read the bytes that exist
        uint32_t wv = 0;
        for (int64_t b = al; b < total; ++b) wv |= uint32_t(op.block_scale[b]) << (8 * (b - al));
        *reinterpret_cast<uint32_t*>(sdst + r * 4) = wv;
      } else {
        cp_async(sdst + r * 4, op.block_scale + al, ok ? 4 : 0, 4);
      }
    }
  }
}

// Dequantize the raw stage of a kRows x 64 tile into the swizzled bf16 tile: 16-value pieces,
// piece p = tid + 256 j is row p / 4, k [16 (p % 4), +16), so the lanes of a warp read contiguous
// raw bytes (no bank conflicts) and write 4 distinct 16-byte positions per row.
// `rep`: the pair table replicated once per lane ([256][32], entry b of lane l at 32 b + l), so the
// 32 lanes' random lookups never share a bank; `scale`: the block-scale table.
template <Format F, int kRows>
__device__ __forceinline__ void dequant_tile(const GemmOperandView& op, const uint32_t* rep,
                                             const uint16_t* scale, const uint8_t* raw,
                                             int64_t grow0, int64_t k0, uint8_t* tile, int tid) {
  const uint32_t* my = rep + (tid & 31);
  constexpr int rb = raw_row_bytes(F);
  static_assert((kRows * 4) % kThreads == 0, "whole pieces per thread");
#pragma unroll
  for (int j = 0; j < kRows * 4 / kThreads; ++j) {
    const int p = tid + j * kThreads, row = p >> 2, q = p & 3;
    const uint8_t* rd = raw + row * rb;
    RawTile t;
    t.valid = true;
    t.scale = 0;
    if constexpr (F == Format::kNvfp4) {
      const uint2 x = *reinterpret_cast<const uint2*>(rd + q * 8);
      t.v[0].x = x.x, t.v[0].y = x.y;
      t.scale = raw[kRows * rb + row * 4 + q];
    } else if constexpr (F == Format::kBf16) {
      t.v[0] = *reinterpret_cast<const uint4*>(rd + q * 32);
      t.v[1] = *reinterpret_cast<const uint4*>(rd + q * 32 + 16);
    } else {
      t.v[0] = *reinterpret_cast<const uint4*>(rd + q * 16);
      if constexpr (F == Format::kMxfp8) {
        const int sshift = int((((grow0 + row) * (op.cols / 32)) + k0 / 32) & 3);
        t.scale = raw[kRows * rb + row * 4 + sshift + q / 2];
      }
    }
    uint32_t o[8];
    dequant16_p<F>([&](uint32_t b) { return my[b * 32]; }, scale, t, o);
    *reinterpret_cast<uint4*>(tile + swz(row, 2 * q)) = make_uint4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<uint4*>(tile + swz(row, 2 * q + 1)) = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

template <int kBN>
constexpr int wgmma_tile_bytes() {
  return 2 * (kBM + kBN) * kRowBytes;  // two bf16 stages
}
constexpr int kRepLutBytes = 256 * 32 * 4;
constexpr int rep_lut_bytes(Format f) { return f == Format::kBf16 ? 0 : kRepLutBytes; }
template <Format FA, Format FW>
constexpr int wgmma_fixed_bytes(int tile_bytes) {
  // + column outer scales and biases (2 x 128 floats) + alignment slack
  return tile_bytes + rep_lut_bytes(FA) + rep_lut_bytes(FW) + 2 * int(sizeof(OperandLuts)) +
         2 * 128 * 4 + 1024;
}
template <int kBN, Format FA, Format FW>
constexpr int wgmma_stages() {
  const int fixed = wgmma_fixed_bytes<FA, FW>(wgmma_tile_bytes<kBN>());
  const int s = (kSmemBudget - fixed) / (raw_tile_bytes(FA, kBM) + raw_tile_bytes(FW, kBN));
  return s < 16 ? s : 16;
}
template <int kBN, Format FA, Format FW>
constexpr int wgmma_smem_bytes() {
  return wgmma_fixed_bytes<FA, FW>(wgmma_tile_bytes<kBN>()) +
         wgmma_stages<kBN, FA, FW>() * (raw_tile_bytes(FA, kBM) + raw_tile_bytes(FW, kBN));
}

template <int kBN>
__device__ __forceinline__ void wgmma_step(float (&acc)[kBN / 2], uint64_t da, uint64_t db) {
  static_assert(kBN == 128, "m64n128k16 only");
  wgmma_m64n128k16(acc, da, db, 1);
}

// grid: x = W row tiles of a group, y = A row tiles of a group, z = group.
template <int kBN, Format FA, Format FW>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_kernel(GemmOperandView a, GemmOperandView w, int64_t n, const GemmGroupDesc* groups,
                 DeviceEpilogue ep, GemmOutView out, float* raw) {
  extern __shared__ uint8_t smem_raw[];
  const GemmGroupDesc G = groups[blockIdx.z];
  const int64_t m0 = int64_t(blockIdx.y) * kBM;
  if (m0 >= G.rows) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  // bf16 tiles on a 1024-byte boundary (the swizzle atom): [2][A 128 rows | W kBN rows] x 128 B,
  // then the raw stages [kStages][A raw | W raw], then the lookup tables.
  uint8_t* smem =
      smem_raw + ((1024 - (uint32_t(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  constexpr int kStageBytes = (kBM + kBN) * kRowBytes;
  constexpr int raw_a = raw_tile_bytes(FA, kBM), raw_stage = raw_a + raw_tile_bytes(FW, kBN);
  constexpr int kStages = wgmma_stages<kBN, FA, FW>();
  static_assert(kStages >= 3, "at least two raw steps in flight");
  uint8_t* raws = smem + wgmma_tile_bytes<kBN>();
  uint32_t* rep_a = reinterpret_cast<uint32_t*>(raws + kStages * raw_stage);
  uint32_t* rep_w = rep_a + rep_lut_bytes(FA) / 4;
  OperandLuts& lut_a =
      *reinterpret_cast<OperandLuts*>(reinterpret_cast<uint8_t*>(rep_w) + rep_lut_bytes(FW));
  OperandLuts& lut_w = *(&lut_a + 1);
  const int tid = threadIdx.x;
  lut_a.scale[tid] = scale_entry(a.format, uint32_t(tid));
  lut_w.scale[tid] = scale_entry(w.format, uint32_t(tid));
  {  // one codec call per thread and table, 32 replicas; the rotation spreads a store over 32 banks
    const uint32_t va = pair_entry(a.format, a.elem, uint32_t(tid)),
                   vw = pair_entry(w.format, w.elem, uint32_t(tid));
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      if constexpr (FA != Format::kBf16) rep_a[tid * 32 + ((c + tid) & 31)] = va;
      if constexpr (FW != Format::kBf16) rep_w[tid * 32 + ((c + tid) & 31)] = vw;
    }
  }

  const int64_t K = a.cols;
  const int ktiles = int(K / kBK);
  const int64_t a_valid = G.rows - m0, w_valid = n - n0;
  auto issue = [&](int kt) {
    if (kt < ktiles) {
      uint8_t* st = raws + (kt % kStages) * raw_stage;
      issue_raw<FA, kBM>(a, G.a_row0 + m0, a_valid, int64_t(kt) * kBK, st, tid);
      issue_raw<FW, kBN>(w, G.w_row0 + n0, w_valid, int64_t(kt) * kBK, st + raw_a, tid);
    }
    cp_async_commit();  // possibly empty: keeps one group per step
  };
  auto dequant = [&](int kt, uint8_t* tile) {
    const uint8_t* st = raws + (kt % kStages) * raw_stage;
    dequant_tile<FA, kBM>(a, rep_a, lut_a.scale, st, G.a_row0 + m0, int64_t(kt) * kBK, tile, tid);
    dequant_tile<FW, kBN>(w, rep_w, lut_w.scale, st + raw_a, G.w_row0 + n0, int64_t(kt) * kBK,
                          tile + kBM * kRowBytes, tid);
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  cp_async_wait<kStages - 2>();
  __syncthreads();  // luts, raw step 0
  dequant(0, smem);
  fence_proxy_async();
  __syncthreads();

  const int wg = tid >> 7;  // warpgroup: tile rows [64 wg, 64 wg + 64)
  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;

  for (int kt = 0; kt < ktiles; ++kt) {
    uint8_t* st = smem + (kt & 1) * kStageBytes;
    issue(kt + kStages - 1);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kBK / 16; ++j)
      wgmma_step<kBN>(acc, smem_desc(st + wg * 64 * kRowBytes + j * 32),
                      smem_desc(st + kBM * kRowBytes + j * 32));
    wgmma_commit();
    if (kt + 1 < ktiles) {
      cp_async_wait<kStages - 2>();  // this thread's copies of step kt + 1 have landed
      __syncthreads();               // and everyone's
      dequant(kt + 1, smem + ((kt + 1) & 1) * kStageBytes);
      fence_proxy_async();
    }
    wgmma_wait_all();
    __syncthreads();
  }
  cp_async_wait<0>();

  // Column outer scales and biases of the tile into shared memory, then the epilogue from
  // registers.
  float* s_ow = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(&lut_w + 1));
  float* s_bias = s_ow + kBN;
  for (int cc = tid; cc < kBN; cc += kThreads) stage_columns(cc, n0, n, G, w, ep, s_ow, s_bias);
  __syncthreads();
  if (out.d_bf16)
    wgmma_epilogue<kBN, true>(acc, m0 + wg * 64, tid & 127, n0, G, a, n, ep, out, raw, s_ow,
                              s_bias);
  else
    wgmma_epilogue<kBN, false>(acc, m0 + wg * 64, tid & 127, n0, G, a, n, ep, out, raw, s_ow,
                               s_bias);
}

template <int kBN, Format FA, Format FW>
void launch_wgmma_t(dim3 grid, cudaStream_t stream, const GemmOperandView& a,
                    const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                    const DeviceEpilogue& ep, GemmOutView out, float* raw) {
  static bool attr_set = false;  // once per instantiation (per process; one device)
  constexpr int smem = wgmma_smem_bytes<kBN, FA, FW>();
  if (!attr_set) {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(wgmma_kernel<kBN, FA, FW>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  wgmma_kernel<kBN, FA, FW><<<grid, kThreads, smem, stream>>>(a, w, n, groups.table, ep, out, raw);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

template <int kBN, Format FA>
void launch_wgmma_w(dim3 grid, cudaStream_t stream, const GemmOperandView& a,
                    const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                    const DeviceEpilogue& ep, GemmOutView out, float* raw) {
  switch (w.format) {
    case Format::kNvfp4:
      return launch_wgmma_t<kBN, FA, Format::kNvfp4>(grid, stream, a, w, n, groups, ep, out, raw);
    case Format::kMxfp8:
      return launch_wgmma_t<kBN, FA, Format::kMxfp8>(grid, stream, a, w, n, groups, ep, out, raw);
    case Format::kFp8:
      return launch_wgmma_t<kBN, FA, Format::kFp8>(grid, stream, a, w, n, groups, ep, out, raw);
    default:
      return launch_wgmma_t<kBN, FA, Format::kBf16>(grid, stream, a, w, n, groups, ep, out, raw);
  }
}

template <int kBN>
void launch_wgmma_bn(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                     const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                     float* raw, cudaStream_t stream) {
  const dim3 grid(unsigned((n + kBN - 1) / kBN), unsigned((groups.max_rows + kBM - 1) / kBM),
                  unsigned(groups.groups));
  switch (a.format) {
    case Format::kNvfp4:
      return launch_wgmma_w<kBN, Format::kNvfp4>(grid, stream, a, w, n, groups, ep, out, raw);
    case Format::kMxfp8:
      return launch_wgmma_w<kBN, Format::kMxfp8>(grid, stream, a, w, n, groups, ep, out, raw);
    case Format::kFp8:
      return launch_wgmma_w<kBN, Format::kFp8>(grid, stream, a, w, n, groups, ep, out, raw);
    default:
      return launch_wgmma_w<kBN, Format::kBf16>(grid, stream, a, w, n, groups, ep, out, raw);
  }
}

}  // namespace

bool wgmma_supported(int64_t k) {
  if (k % kBK != 0) return false;
  static const int cc = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major * 10 + minor;
  }();
  return cc == 90;
}

GemmVariant launch_wgmma(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                         const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                         Scratch& scratch, GemmVariant route, cudaStream_t stream) {
  const int64_t K = a.cols;
  if (!wgmma_supported(K))
    throw GemmError(
        cat("qgemm wgmma kernel: needs an sm_90 GPU and K % ", kBK, " == 0 (K = ", K, ")"));
  if (const int tile = wreg_wgmma_tile(
          a, w, groups, route)) {  // the same chain, nvfp4 W decoded inside the kernel
    if (groups.groups > 0 && groups.max_rows > 0 && n > 0)
      launch_wgmma_wreg(tile, a, w, n, groups, ep, out, scratch, stream);
    return tile == 256 ? GemmVariant::kWgmmaWreg256 : GemmVariant::kWgmmaWreg128;
  }
  if (route == GemmVariant::kWgmmaStaged
          ? staged_wgmma_usable(a, w)
          : route != GemmVariant::kWgmmaInloop && staged_wgmma_preferred(a, w, groups)) {
    // the same chain on bf16 copies through TMA
    if (groups.groups > 0 && groups.max_rows > 0 && n > 0)
      launch_wgmma_staged(a, w, n, groups, ep, out, scratch, stream);
    return GemmVariant::kWgmmaStaged;
  }
  if (groups.groups == 0 || groups.max_rows == 0 || n == 0) return GemmVariant::kWgmmaInloop;
  float* raw = tile_grid_checks("wgmma", kBM, groups, n, ep, scratch);
  launch_wgmma_bn<128>(a, w, n, groups, ep, out, raw, stream);
  if (raw) launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
  return GemmVariant::kWgmmaInloop;
}

}  // namespace lockstep::cuda::gemm_detail
