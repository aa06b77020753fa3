// The tiled (any M) deterministic CUDA GEMM: 128x128 output tiles, K walked in fixed 32-wide
// steps from 0 to K (no split-K), both operands dequantized exactly into bf16 in shared memory
// (double-buffered, next tile prefetched into registers), bf16 mma.sync with fp32 accumulators,
// outer scales and epilogue last. Every output element's chain depends only on K, so row i's bits
// do not depend on M, the other rows or their order (batch-invariant by construction).
// With fp8 chunk scales (1x128 / 128x128 operands) the kernel runs the chunked chain of
// docs/gemm.md section 3: the mma accumulators hold one 128-wide chunk's partial sums, which are
// promoted into a second set of fp32 accumulators as acc = RN(acc + RN(part * RN(sa_c * sw_c))) in
// ascending chunk order, then reset.
#include "qgemm_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kThreads = 256;
constexpr int kStride = kBK + 8;  // bf16 per smem row: 80 B, ldmatrix conflict-free

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Chunk scale of operand row `row` for chunk c; 1 for an operand without chunk scales.
__device__ __forceinline__ float chunk_scale_of(const GemmOperandView& op, int64_t row, int64_t c) {
  return op.chunk_scale ? op.chunk_scale[row * (op.cols / 128) + c] : 1.0f;
}

// grid: x = W row tiles of a group, y = A row tiles of a group, z = group.
template <bool kChunked>
__global__ void __launch_bounds__(kThreads)
    tiled_kernel(GemmOperandView a, GemmOperandView w, int64_t n, const GemmGroupDesc* groups,
                 DeviceEpilogue ep, GemmOutView out, float* raw) {
  __shared__ __align__(16) uint16_t As[2][kBM * kStride];
  __shared__ __align__(16) uint16_t Ws[2][kBN * kStride];
  __shared__ OperandLuts lut_a, lut_w;
  const GemmGroupDesc G = groups[blockIdx.z];
  const int64_t m0 = int64_t(blockIdx.y) * kBM;
  if (m0 >= G.rows) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  lut_a.pair[tid] = pair_entry(a.format, a.elem, uint32_t(tid));
  lut_w.pair[tid] = pair_entry(w.format, w.elem, uint32_t(tid));
  lut_a.scale[tid] = scale_entry(a.format, uint32_t(tid));
  lut_w.scale[tid] = scale_entry(w.format, uint32_t(tid));

  const int64_t K = a.cols;
  const int lr = tid >> 1, lk = (tid & 1) * 16;
  const bool a_ok = m0 + lr < G.rows, w_ok = n0 + lr < n;
  const int64_t a_row = G.a_row0 + m0 + lr, w_row = G.w_row0 + n0 + lr;
  RawTile ra, rw;
  load_raw(a, a_row, a_ok, lk, ra);
  load_raw(w, w_row, w_ok, lk, rw);
  __syncthreads();  // luts
  store_tile(a, lut_a, ra, &As[0][lr * kStride + lk]);
  store_tile(w, lut_w, rw, &Ws[0][lr * kStride + lk]);
  __syncthreads();

  const int wm = warp >> 1, wn = warp & 1;  // warp tile: A rows [32 wm, +32), W rows [64 wn, +64)
  const int g = lane >> 2, t = lane & 3;
  float acc[2][8][4];    // plain: the chain; chunked: the current chunk's partial sums
  float total[2][8][4];  // chunked: the promoted chain (unused otherwise)
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = total[i][j][q] = 0.0f;
  // chunked: acc of chunk c -> total (rows / columns past the tile's valid range use scale 1; they
  // are never stored)
  auto promote = [&](int64_t c) {
    float sa[2][2], sw[8][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = m0 + wm * 32 + i * 16 + g + h * 8;
        sa[i][h] = r < G.rows ? chunk_scale_of(a, G.a_row0 + r, c) : 1.0f;
      }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = n0 + wn * 64 + j * 8 + 2 * t + h;
        sw[j][h] = col < n ? chunk_scale_of(w, G.w_row0 + col, c) : 1.0f;
      }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float s = num::mul_rn(sa[i][q >> 1], sw[j][q & 1]);
          total[i][j][q] = num::add_rn(total[i][j][q], num::mul_rn(acc[i][j][q], s));
          acc[i][j][q] = 0.0f;
        }
  };

  const int ktiles = int(K / kBK);
  for (int kt = 0; kt < ktiles; ++kt) {
    const int cur = kt & 1;
    if (kt + 1 < ktiles) {
      load_raw(a, a_row, a_ok, int64_t(kt + 1) * kBK + lk, ra);
      load_raw(w, w_row, w_ok, int64_t(kt + 1) * kBK + lk, rw);
    }
#pragma unroll
    for (int ks = 0; ks < kBK; ks += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        ldmatrix_x4(af[i],
                    &As[cur][(wm * 32 + i * 16 + (lane & 15)) * kStride + ks + (lane >> 4) * 8]);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t bf[4];
        ldmatrix_x4(bf, &Ws[cur][(wn * 64 + jj * 16 + (lane & 7) + ((lane >> 4) << 3)) * kStride +
                                 ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_bf16_16816(acc[i][2 * jj], af[i][0], af[i][1], af[i][2], af[i][3], bf[0], bf[1]);
          mma_bf16_16816(acc[i][2 * jj + 1], af[i][0], af[i][1], af[i][2], af[i][3], bf[2], bf[3]);
        }
      }
    }
    if constexpr (kChunked) {
      if ((kt + 1) % (128 / kBK) == 0) promote(kt / (128 / kBK));
    }
    if (kt + 1 < ktiles) {
      store_tile(a, lut_a, ra, &As[cur ^ 1][lr * kStride + lk]);
      store_tile(w, lut_w, rw, &Ws[cur ^ 1][lr * kStride + lk]);
    }
    __syncthreads();
  }

  if constexpr (kChunked) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = total[i][j][q];
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t r = m0 + wm * 32 + i * 16 + g + (q >= 2 ? 8 : 0);
      if (r >= G.rows) continue;
      const int64_t orow = G.a_row0 + r;
      const float oa = outer_of(a, orow);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int64_t c = n0 + wn * 64 + j * 8 + 2 * t + (q & 1);
        if (c >= n) continue;
        if (raw) {
          raw[orow * n + c] = acc[i][j][q];
        } else {
          const float y = r < G.tokens ? epilogue_value(acc[i][j][q], oa, outer_of(w, G.w_row0 + c),
                                                        ep, G.w_row0 + c)
                                       : 0.0f;
          store_out(out, orow * n + c, y);
        }
      }
    }
  }
}

}  // namespace

void launch_tiled(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                  const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                  Scratch& scratch, cudaStream_t stream) {
  const int64_t K = a.cols;
  if (K % kBK != 0)
    throw GemmError(cat("qgemm tiled kernel: needs K % ", kBK, " == 0 (K = ", K, ")"));
  const bool chunked = a.chunk_scale || w.chunk_scale;
  if (chunked && K % 128 != 0)
    throw GemmError(cat("qgemm tiled kernel: fp8 chunk scales need K % 128 == 0 (K = ", K, ")"));
  if (groups.groups == 0 || groups.max_rows == 0 || n == 0) return;
  float* raw = tile_grid_checks("tiled", kBM, groups, n, ep, scratch);
  const dim3 grid(unsigned((n + kBN - 1) / kBN), unsigned((groups.max_rows + kBM - 1) / kBM),
                  unsigned(groups.groups));
  if (chunked)
    tiled_kernel<true><<<grid, kThreads, 0, stream>>>(a, w, n, groups.device_table(), ep, out, raw);
  else
    tiled_kernel<false>
        <<<grid, kThreads, 0, stream>>>(a, w, n, groups.device_table(), ep, out, raw);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  if (raw) launch_epilogue(raw, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
}

}  // namespace lockstep::cuda::gemm_detail
