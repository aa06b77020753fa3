// The small-M (decode) CUDA GEMM: 1..16 rows of A per group against packed NVFP4 / MXFP8 / FP8
// weights, limited by the bandwidth of streaming W. Each warp owns 16 rows of W and a fixed
// 2048-wide K slice, streams its packed bytes with 16-byte loads, dequantizes them exactly into
// bf16 (shared-memory lookup tables built from the codecs) and runs bf16 mma.sync with fp32
// accumulators; slices are summed in ascending order by the epilogue kernel. The order depends on
// K only (docs/gemm.md "CUDA decode order"), so row i's bits do not depend on M or the other rows.
#include "qgemm_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerBlock = kWarps * 16;  // W rows per block
constexpr int kAStride = kDecodeSlice + 8;  // staged A row stride in bf16 (+16 B against bank conflicts)
constexpr int kUnroll = 4;                  // 128-wide k blocks loaded ahead by each warp
constexpr int kLutBytes = 256 * 32 * 4;     // pair table, one copy per lane (conflict-free lookups)
constexpr int kSmemFixed = kLutBytes + 512;

template <int kNT>
constexpr int decode_smem_bytes() {
  return kSmemFixed + kNT * 8 * kAStride * 2;
}

// One block: W rows [bx*128, bx*128 + 128) of group z, K slice y; kNT n-tiles of 8 A rows.
template <bool kNvfp4, int kNT>
__global__ void __launch_bounds__(kWarps * 32) decode_kernel(GemmOperandView a, GemmOperandView w, int64_t n,
                                                             const GemmGroupDesc* groups, DeviceEpilogue ep,
                                                             GemmOutView out, float* ws, int64_t rows_total,
                                                             bool direct) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem);                  // [256][32]
  uint16_t* slut = reinterpret_cast<uint16_t*>(smem + kLutBytes);     // [256]
  uint16_t* As = reinterpret_cast<uint16_t*>(smem + kSmemFixed);      // [kNT * 8][kAStride]
  const GemmGroupDesc G = groups[blockIdx.z];
  if (G.rows == 0) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t K = w.cols;
  const int64_t k0 = int64_t(blockIdx.y) * kDecodeSlice;
  const int ks = int(K - k0 < kDecodeSlice ? K - k0 : kDecodeSlice);

  {  // one codec call per thread (256 threads = 256 codes), then 32 replicas; the rotation keeps
     // the 32 lanes of a store on 32 different banks
    static_assert(kWarps * 32 == 256, "one thread per byte code");
    const uint32_t v = pair_entry(w.format, w.elem, uint32_t(tid));
#pragma unroll 8
    for (int c = 0; c < 32; ++c) lut[tid * 32 + ((c + tid) & 31)] = v;
    slut[tid] = scale_entry(w.format, uint32_t(tid));
  }
  // Stage A[rows of the group, k0 .. k0 + ks) as exact bf16; rows past the group are zero.
  constexpr int kM = kNT * 8;
  if (a.format == GemmFormat::kBf16) {
    const int vec = ks / 8;  // 16-byte vectors per row
    for (int i = tid; i < kM * vec; i += kWarps * 32) {
      const int r = i / vec, c = i % vec;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < G.rows)
        v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.data) + (G.a_row0 + r) * K + k0 + c * 8);
      *reinterpret_cast<uint4*>(As + r * kAStride + c * 8) = v;
    }
  } else {
    for (int i = tid; i < kM * ks; i += kWarps * 32) {
      const int r = i / ks, c = i % ks;
      As[r * kAStride + c] = r < G.rows ? inner_bf16(a, G.a_row0 + r, k0 + c) : uint16_t(0);
    }
  }
  __syncthreads();

  const int g = lane >> 2, t = lane & 3;
  const int64_t jr = int64_t(blockIdx.x) * kRowsPerBlock + warp * 16;
  if (jr >= n) return;
  const int64_t j0 = jr + g, j1 = jr + g + 8;
  const bool v0 = j0 < n, v1 = j1 < n;
  const int64_t wr0 = G.w_row0 + (v0 ? j0 : jr), wr1 = G.w_row0 + (v1 ? j1 : jr);  // clamped; discarded
  const bool mx = w.format == GemmFormat::kMxfp8;
  const uint8_t* wd = static_cast<const uint8_t*>(w.data);
  // Thread (g, t) reads elements [k + 32t, k + 32t + 32) of rows j0 and j1 for each 128-wide k.
  const uint8_t* p0;
  const uint8_t* p1;
  const uint8_t* s0p;
  const uint8_t* s1p;
  if constexpr (kNvfp4) {
    p0 = wd + wr0 * (K / 2) + (k0 + 32 * t) / 2;
    p1 = wd + wr1 * (K / 2) + (k0 + 32 * t) / 2;
    s0p = w.block_scale + wr0 * (K / 16) + (k0 + 32 * t) / 16;
    s1p = w.block_scale + wr1 * (K / 16) + (k0 + 32 * t) / 16;
  } else {
    p0 = wd + wr0 * K + k0 + 32 * t;
    p1 = wd + wr1 * K + k0 + 32 * t;
    s0p = mx ? w.block_scale + wr0 * (K / 32) + (k0 + 32 * t) / 32 : nullptr;
    s1p = mx ? w.block_scale + wr1 * (K / 32) + (k0 + 32 * t) / 32 : nullptr;
  }
  constexpr int kBytesPerBlock = kNvfp4 ? 64 : 128;  // per row per 128-wide k block
  constexpr int kVec = kNvfp4 ? 1 : 2;               // 16-byte loads per row per thread
  constexpr int kScaleStep = kNvfp4 ? 8 : 4;         // scale bytes per row per k block

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
  const int nblk = ks / 128;
  const uint32_t* my_lut = lut + lane;
  for (int b0 = 0; b0 < nblk; b0 += kUnroll) {
    uint4 x0[kUnroll][kVec], x1[kUnroll][kVec];
    uint32_t sc0[kUnroll], sc1[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (b0 + u < nblk) {
        const int64_t off = int64_t(b0 + u) * kBytesPerBlock;
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
          x0[u][v] = ldg_stream16(p0 + off + 16 * v);
          x1[u][v] = ldg_stream16(p1 + off + 16 * v);
        }
        if constexpr (kNvfp4) {
          sc0[u] = __ldg(reinterpret_cast<const uint16_t*>(s0p + (b0 + u) * kScaleStep));
          sc1[u] = __ldg(reinterpret_cast<const uint16_t*>(s1p + (b0 + u) * kScaleStep));
        } else if (mx) {
          sc0[u] = __ldg(s0p + (b0 + u) * kScaleStep);
          sc1[u] = __ldg(s1p + (b0 + u) * kScaleStep);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (b0 + u >= nblk) break;
      const uint16_t* arow = As + (b0 + u) * 128 + 32 * t;
      const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&x0[u][0]);
      const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&x1[u][0]);
      uint32_t sA = 0, sB = 0, sA2 = 0, sB2 = 0;
      if constexpr (kNvfp4) {
        sA = uint32_t(slut[sc0[u] & 0xFF]) * 0x10001u, sA2 = uint32_t(slut[sc0[u] >> 8]) * 0x10001u;
        sB = uint32_t(slut[sc1[u] & 0xFF]) * 0x10001u, sB2 = uint32_t(slut[sc1[u] >> 8]) * 0x10001u;
      } else if (mx) {
        sA = uint32_t(slut[sc0[u]]) * 0x10001u, sB = uint32_t(slut[sc1[u]]) * 0x10001u;
      }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        // mma k slots (2t, 2t+1) <- elements 4s, 4s+1 of the thread's 32; (2t+8, 2t+9) <- 4s+2, 4s+3.
        // A (activations) uses the same permutation, so the sum over k is unchanged.
        uint32_t a0, a1, a2, a3;
        if constexpr (kNvfp4) {
          const uint32_t q0 = w0[s >> 1] >> ((s & 1) * 16), q1 = w1[s >> 1] >> ((s & 1) * 16);
          const uint32_t m0 = s < 4 ? sA : sA2, m1 = s < 4 ? sB : sB2;
          a0 = bf16x2_mul(my_lut[(q0 & 0xFF) * 32], m0);
          a2 = bf16x2_mul(my_lut[((q0 >> 8) & 0xFF) * 32], m0);
          a1 = bf16x2_mul(my_lut[(q1 & 0xFF) * 32], m1);
          a3 = bf16x2_mul(my_lut[((q1 >> 8) & 0xFF) * 32], m1);
        } else {
          const uint32_t q0 = w0[s], q1 = w1[s];
          a0 = __byte_perm(my_lut[(q0 & 0xFF) * 32], my_lut[((q0 >> 8) & 0xFF) * 32], 0x5410);
          a2 = __byte_perm(my_lut[((q0 >> 16) & 0xFF) * 32], my_lut[(q0 >> 24) * 32], 0x5410);
          a1 = __byte_perm(my_lut[(q1 & 0xFF) * 32], my_lut[((q1 >> 8) & 0xFF) * 32], 0x5410);
          a3 = __byte_perm(my_lut[((q1 >> 16) & 0xFF) * 32], my_lut[(q1 >> 24) * 32], 0x5410);
          if (mx) {
            a0 = bf16x2_mul(a0, sA), a2 = bf16x2_mul(a2, sA);
            a1 = bf16x2_mul(a1, sB), a3 = bf16x2_mul(a3, sB);
          }
        }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const uint2 bv = *reinterpret_cast<const uint2*>(arow + (nt * 8 + g) * kAStride + 4 * s);
          mma_bf16_16816(acc[nt], a0, a1, a2, a3, bv.x, bv.y);
        }
      }
    }
  }

  // acc[nt][q]: W row (q < 2 ? j0 : j1), A row nt * 8 + 2t + (q & 1).
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int tok = nt * 8 + 2 * t + (q & 1);
      const int64_t j = q < 2 ? j0 : j1;
      if (!(q < 2 ? v0 : v1) || tok >= G.rows) continue;
      const int64_t orow = G.a_row0 + tok;
      if (direct) {
        const float y = tok < G.tokens
                            ? epilogue_value(acc[nt][q], outer_of(a, orow), outer_of(w, G.w_row0 + j), ep, G.w_row0 + j)
                            : 0.0f;
        store_out(out, orow * n + j, y);
      } else {
        ws[(int64_t(blockIdx.y) * rows_total + orow) * n + j] = acc[nt][q];
      }
    }
  }
}

__global__ void epilogue_kernel(const float* ws, int slices, int64_t rows_total, GemmOperandView a,
                                GemmOperandView w, int64_t n, const GemmGroupDesc* groups, DeviceEpilogue ep,
                                GemmOutView out) {
  const GemmGroupDesc G = groups[blockIdx.z];
  const int r = blockIdx.y;
  if (r >= G.rows) return;
  const int64_t orow = G.a_row0 + r;
  const int64_t oc = ep.swiglu ? n / 2 : n;
  const float oa = outer_of(a, orow);
  const float p = ep.router_prob ? ep.router_prob[orow] : 1.0f;
  auto value = [&](int64_t j) {
    float acc = ws[orow * n + j];
    for (int s = 1; s < slices; ++s) acc = num::add_rn(acc, ws[(int64_t(s) * rows_total + orow) * n + j]);
    return epilogue_value(acc, oa, outer_of(w, G.w_row0 + j), ep, G.w_row0 + j);
  };
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < oc; c += int64_t(gridDim.x) * blockDim.x) {
    float y = 0.0f;
    if (r < G.tokens) y = ep.swiglu ? num::swiglu_weighted_f32(value(c), value(oc + c), p) : value(c);
    store_out(out, orow * oc + c, y);
  }
}

template <bool kNvfp4, int kNT>
void launch_decode_t(dim3 grid, cudaStream_t stream, const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                     const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out, float* ws,
                     bool direct) {
  static bool attr_set = false;  // once per instantiation (per process; one device)
  constexpr int smem = decode_smem_bytes<kNT>();
  if (!attr_set) {
    LOCKSTEP_CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<kNvfp4, kNT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  decode_kernel<kNvfp4, kNT><<<grid, kWarps * 32, smem, stream>>>(
      a, w, n, groups.table.as<GemmGroupDesc>(), ep, out, ws, groups.total_rows, direct);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_epilogue(const float* ws, int slices, int64_t rows_total, const GemmOperandView& a,
                     const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups, const DeviceEpilogue& ep,
                     GemmOutView out, cudaStream_t stream) {
  if (groups.max_rows == 0 || groups.groups == 0) return;
  const int64_t oc = ep.swiglu ? n / 2 : n;
  const int threads = 256;
  const dim3 grid(unsigned((oc + threads - 1) / threads), unsigned(groups.max_rows), unsigned(groups.groups));
  epilogue_kernel<<<grid, threads, 0, stream>>>(ws, slices, rows_total, a, w, n, groups.table.as<GemmGroupDesc>(), ep,
                                                out);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

void launch_decode(const GemmOperandView& a, const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                   const DeviceEpilogue& ep, GemmOutView out, DeviceBuffer& workspace, cudaStream_t stream) {
  const int64_t K = w.cols;
  if (K % 128 != 0 || groups.max_rows > kDecodeMaxRows || w.format == GemmFormat::kBf16)
    throw GemmError(cat("qgemm decode kernel: needs K % 128 == 0 (K = ", K, "), <= ", kDecodeMaxRows, " rows per group (max ", groups.max_rows, ") and packed W (nvfp4, mxfp8, fp8)"));
  if (groups.groups == 0 || groups.max_rows == 0 || n == 0) return;
  const int slices = int((K + kDecodeSlice - 1) / kDecodeSlice);
  const bool direct = slices == 1 && !ep.swiglu;
  float* ws = nullptr;
  if (!direct) {
    const size_t need = size_t(slices) * size_t(groups.total_rows) * size_t(n) * sizeof(float);
    if (workspace.size() < need) workspace.resize(need);
    ws = workspace.as<float>();
  }
  const dim3 grid(unsigned((n + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(slices), unsigned(groups.groups));
  const bool four = w.format == GemmFormat::kNvfp4;
  const bool two = groups.max_rows > 8;
  if (four && !two) launch_decode_t<true, 1>(grid, stream, a, w, n, groups, ep, out, ws, direct);
  if (four && two) launch_decode_t<true, 2>(grid, stream, a, w, n, groups, ep, out, ws, direct);
  if (!four && !two) launch_decode_t<false, 1>(grid, stream, a, w, n, groups, ep, out, ws, direct);
  if (!four && two) launch_decode_t<false, 2>(grid, stream, a, w, n, groups, ep, out, ws, direct);
  if (!direct) launch_epilogue(ws, slices, groups.total_rows, a, w, n, groups, ep, out, stream);
}

}  // namespace lockstep::cuda::gemm_detail
