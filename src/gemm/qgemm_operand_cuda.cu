// Device GEMM operands (qgemm_operand_cuda.h): the small kernels that make every copy a K-major
// operand with compact scales (unswizzle, transpose, K padding) and expand the outer and chunk
// scales per row, and the host logic that picks them for each format, copy and outer domain.
#include <algorithm>

#include "lockstep/numerics/block_rules.h"
#include "lockstep/quant/scale_access.h"
#include "operand.h"
#include "qgemm_cuda.cuh"
#include "qgemm_operand_cuda.h"

namespace lockstep::cuda {
namespace {

using gemm_detail::cat;

__global__ void unswizzle_kernel(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out) {
  const int64_t pc = round_up(cols, 4);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = in[swizzled_offset(i / cols, i % cols, pc)];
}

// Which outer domain operand row j reads: 0, j, its group (offsets) or j / div.
enum class DomMode : int { kZero, kRow, kGroupOfRow, kDiv };
struct OuterArgs {
  int64_t m = 0;
  bool nvfp4 = false;  // S_dec of the domain's amax; else the domain's fp32 scale_inv itself
  DomMode mode = DomMode::kZero;
  const float* src = nullptr;
  const int64_t* offsets = nullptr;
  int64_t groups = 0;
  int64_t div = 1;
  float* out = nullptr;
};

__global__ void outer_kernel(OuterArgs p) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < p.m;
       j += int64_t(gridDim.x) * blockDim.x) {
    int64_t d = 0;
    if (p.mode == DomMode::kRow)
      d = j;
    else if (p.mode == DomMode::kGroupOfRow)
      d = group_of_row(p.offsets, p.groups, j);
    else if (p.mode == DomMode::kDiv)
      d = j / p.div;
    p.out[j] = p.nvfp4 ? num::two_level_outer(p.src[d], num::kE2M1Max).s_dec : p.src[d];
  }
}

// FP8 128x128 chunk scales per operand row: row j of group j / n (n rows per group, nbc = its
// 128-row tiles) reads tile row (j / n) * nbc + (j % n) / 128 of the scale_inv grid [., nch].
__global__ void chunk_kernel(const float* si, int64_t m, int64_t nch, int64_t n, int64_t nbc,
                             float* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m * nch;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i / nch, c = i % nch;
    out[i] = si[((j / n) * nbc + (j % n) / 128) * nch + c];
  }
}

// out[b][c][r] = r < R ? in[b * in_bs + r * ld + c] : fill for c < C, r < Rp (32 x 32 tiles).
template <class T>
__global__ void transpose_pad_kernel(const T* in, int64_t R, int64_t C, int64_t ld, int64_t in_bs,
                                     T* out, int64_t Rp, T fill) {
  __shared__ T tile[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t r0 = int64_t(blockIdx.x) * 32, c0 = int64_t(blockIdx.y) * 32, b = blockIdx.z;
  const T* src = in + b * in_bs;
  T* dst = out + b * C * Rp;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + ty + 8 * i, c = c0 + tx;
    tile[ty + 8 * i][tx] = r < R && c < C ? src[r * ld + c] : fill;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = c0 + ty + 8 * i, r = r0 + tx;
    if (c < C && r < Rp) dst[c * Rp + r] = tile[tx][ty + 8 * i];
  }
}

// out[j][b] = b < nb ? in[j * ld + b] : fill for j < m, b < nb_out (bytes).
__global__ void pad_rows_kernel(const uint8_t* in, int64_t m, int64_t nb, int64_t ld, uint8_t* out,
                                int64_t nb_out, uint8_t fill) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m * nb_out;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i / nb_out, b = i % nb_out;
    out[i] = b < nb ? in[j * ld + b] : fill;
  }
}

unsigned grid_for(int64_t n) { return unsigned(std::clamp<int64_t>((n + 255) / 256, 1, 4096)); }

const uint8_t* unswizzle(Scratch& s, const uint8_t* in, int64_t rows, int64_t cols) {
  uint8_t* out = s.get<uint8_t>(size_t(rows * cols));
  if (rows * cols == 0) return out;
  unswizzle_kernel<<<grid_for(rows * cols), 256, 0, cu(s.stream())>>>(in, rows, cols, out);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return out;
}

const float* expand_outer(Scratch& s, OuterArgs a) {
  a.out = s.get<float>(size_t(std::max<int64_t>(a.m, 1)));
  if (a.m == 0) return a.out;
  outer_kernel<<<grid_for(a.m), 256, 0, cu(s.stream())>>>(a);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return a.out;
}

const float* expand_chunks(Scratch& s, const float* si, int64_t m, int64_t nch, int64_t n) {
  float* out = s.get<float>(size_t(m * nch));
  if (m * nch == 0) return out;
  chunk_kernel<<<grid_for(m * nch), 256, 0, cu(s.stream())>>>(si, m, nch, n, (n + 127) / 128, out);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return out;
}

// B batches of [R, C] (row stride ld, batch stride in_bs) -> [B][C][Rp] in scratch.
template <class T>
const T* transpose_pad(Scratch& s, const T* in, int64_t B, int64_t R, int64_t C, int64_t ld,
                       int64_t in_bs, int64_t Rp, T fill) {
  T* out = s.get<T>(size_t(B * C * Rp));
  if (B * C * Rp == 0) return out;
  const dim3 grid(unsigned((Rp + 31) / 32), unsigned((C + 31) / 32), unsigned(B));
  if (grid.y > 65535 || grid.z > 65535)
    throw GemmError(
        cat("qgemm cuda: a transposed operand of ", C, " rows x ", B, " groups is too large"));
  transpose_pad_kernel<T>
      <<<grid, dim3(32, 8), 0, cu(s.stream())>>>(in, R, C, ld, in_bs, out, Rp, fill);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return out;
}

const uint8_t* pad_rows(Scratch& s, const void* in, int64_t m, int64_t nb, int64_t nb_out,
                        uint8_t fill) {
  uint8_t* out = s.get<uint8_t>(size_t(m * nb_out));
  if (m * nb_out == 0) return out;
  pad_rows_kernel<<<grid_for(m * nb_out), 256, 0, cu(s.stream())>>>(static_cast<const uint8_t*>(in),
                                                                    m, nb, nb, out, nb_out, fill);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return out;
}

// A part of a quantized operand on the device, contiguous.
template <class T>
const T* part(const Tensor& t, const std::string& what, const char* name) {
  if (!t.defined()) throw GemmError(cat("operand ", what, ": part ", name, " is missing"));
  if (!t.is_cuda() || !t.is_contiguous())
    throw GemmError(cat("operand ", what, ": part ", name, " ", t.describe(),
                        " must be a contiguous device tensor"));
  return t.ptr<T>();
}

const uint8_t* compact_scales(Scratch& s, const QTensor& q, const QData& d, int64_t m, int64_t sc,
                              const std::string& what) {
  const uint8_t* p = part<uint8_t>(d.block_scale, what, "block_scale");
  return q.scale_layout == ScaleLayout::kSwizzled ? unswizzle(s, p, m, sc) : p;
}

const Tensor& dense_bf16(const GemmArg& op, const std::string& what) {
  const Tensor& t = op.t();
  if (t.dtype() != DType::kBF16)
    throw GemmError(
        cat("operand ", what,
            ": dense operands of a CUDA GEMM are BF16 (F32 and F64 operands run on the cpu)"));
  if (!t.is_cuda() || t.dim() != 2 || !t.is_contiguous())
    throw GemmError(
        cat("operand ", what, ": a dense CUDA operand is a contiguous 2-D device tensor"));
  return t;
}

}  // namespace

GemmOperandView prepare_operand(const GemmArg& op, Copy copy, std::string_view name, Scratch& s,
                                int64_t k_pad) {
  const std::string what = op.describe(copy, name);
  const int64_t m = op.rows(copy), k = op.cols(copy), kp = std::max(k, k_pad);
  GemmOperandView v;
  v.rows = m;
  v.cols = kp;
  if (!op.quantized()) {
    const Tensor& t = dense_bf16(op, what);
    v.format = Format::kBf16;
    if (copy == Copy::kRowwise)
      v.data =
          kp == k ? t.raw() : static_cast<const void*>(pad_rows(s, t.raw(), m, 2 * k, 2 * kp, 0));
    else  // X [k, m] -> X^T [m, kp]
      v.data = transpose_pad<uint16_t>(s, t.ptr<uint16_t>(), 1, k, m, m, 0, kp, 0);
    return v;
  }
  gemm::check_operand(op, copy, name);
  const QTensor& q = op.q();
  const QData& d = q.copy(copy);
  v.format = q.format;
  v.elem = q.elem;
  const bool transposed = copy == Copy::kColwise && q.format != Format::kMxfp8;
  // The outer domain of operand row j: rowwise copies by the QTensor's scaling and groups;
  // transposed copies one domain per row of X^T (per_row, 1-D) or one.
  OuterArgs oa;
  oa.m = m;
  if (transposed) {
    oa.mode = q.scaling == Scaling::kPerRow && !q.block2d ? DomMode::kRow : DomMode::kZero;
  } else if (q.scaling == Scaling::kPerRow) {
    oa.mode = DomMode::kRow;
  } else if (q.scaling == Scaling::kPerGroup) {
    oa.mode = DomMode::kGroupOfRow;
    oa.offsets =
        static_cast<const int64_t*>(s.keep(upload_i64(q.group_offsets, s.device(), s.stream())));
    oa.groups = int64_t(q.group_offsets.size()) - 1;
  }
  switch (q.format) {
    case Format::kNvfp4: {
      const uint8_t* data = part<uint8_t>(d.data, what, "data");
      const uint8_t* sc = compact_scales(s, q, d, m, k / 16, what);
      if (kp > k)
        data = pad_rows(s, data, m, k / 2, kp / 2, 0), sc = pad_rows(s, sc, m, k / 16, kp / 16, 0);
      v.data = data, v.block_scale = sc;
      oa.nvfp4 = true;
      oa.src = part<float>(d.amax, what, "amax");
      v.outer = expand_outer(s, oa);
      return v;
    }
    case Format::kFp8: {
      const uint8_t* data = part<uint8_t>(d.data, what, "data");
      v.data = kp > k ? pad_rows(s, data, m, k, kp, 0) : data;
      const float* si = part<float>(d.scale_inv, what, "scale_inv");
      if (q.scaling == Scaling::kBlock1x128 || q.scaling == Scaling::kBlock128x128) {
        if (kp != k) throw GemmError(cat("operand ", what, ": fp8 block scaling cannot pad K"));
        // 1x128: scale_inv is [m, K/128] already (rowwise and transposed copies alike).
        v.chunk_scale =
            q.scaling == Scaling::kBlock1x128 ? si : expand_chunks(s, si, m, k / 128, m);
        return v;
      }
      oa.src = si;
      v.outer = expand_outer(s, oa);
      return v;
    }
    case Format::kMxfp8: {
      if (copy == Copy::kRowwise) {
        const uint8_t* data = part<uint8_t>(d.data, what, "data");
        const uint8_t* sc = compact_scales(s, q, d, m, k / 32, what);
        if (kp > k)
          data = pad_rows(s, data, m, k, kp, 0), sc = pad_rows(s, sc, m, k / 32, kp / 32, 127);
        v.data = data, v.block_scale = sc;
      } else {  // blocks down X's columns: X [k, m], scales [k / 32, m] -> K-major [m, kp], [m, kp
                // / 32]
        v.data =
            transpose_pad<uint8_t>(s, part<uint8_t>(d.data, what, "data"), 1, k, m, m, 0, kp, 0);
        v.block_scale = transpose_pad<uint8_t>(s, part<uint8_t>(d.block_scale, what, "block_scale"),
                                               1, k / 32, m, m, 0, kp / 32, 127);
      }
      return v;
    }
    default:
      throw GemmError(cat("operand ", what, ": not a quantized format"));
  }
}

GemmOperandView prepare_grouped_w_colwise(const GemmArg& w, int64_t groups, int64_t K,
                                          std::string_view name, Scratch& s) {
  const std::string what = w.describe(Copy::kColwise, name);
  const int64_t N = w.cols(Copy::kRowwise), m = groups * N;
  GemmOperandView v;
  v.rows = m;
  v.cols = K;
  if (!w.quantized()) {  // [groups][K][N] -> [groups][N][K]
    const Tensor& t = dense_bf16(w, what);
    v.format = Format::kBf16;
    v.data = transpose_pad<uint16_t>(s, t.ptr<uint16_t>(), groups, K, N, N, K * N, K, 0);
    return v;
  }
  const QTensor& q = w.q();
  std::vector<int64_t> want(size_t(groups + 1));
  for (int64_t e = 0; e <= groups; ++e) want[size_t(e)] = e * K;
  if (q.group_offsets != want)
    throw GemmError(cat("operand ", what,
                        ": a columnwise grouped W is quantized with quantize_grouped over ", groups,
                        " groups of K = ", K, " rows"));
  if (groups > 0) gemm::check_operand(GemmArg(group_view(q, 0)), Copy::kColwise, name);
  const QData& d = q.colwise;
  if (!d.defined()) gemm::check_operand(w, Copy::kColwise, name);  // names the missing copy
  v.format = q.format;
  v.elem = q.elem;
  OuterArgs oa;
  oa.m = m;
  oa.div = std::max<int64_t>(N, 1);
  if (q.scaling == Scaling::kPerRow && !q.block2d)
    oa.mode = DomMode::kRow;
  else if (q.scaling == Scaling::kPerGroup)
    oa.mode = DomMode::kDiv;
  switch (q.format) {
    case Format::kNvfp4:  // the pieces [N, K] back to back are [groups * N, K]
      v.data = part<uint8_t>(d.data, what, "data");
      v.block_scale = part<uint8_t>(d.block_scale, what, "block_scale");
      oa.nvfp4 = true;
      oa.src = part<float>(d.amax, what, "amax");
      v.outer = expand_outer(s, oa);
      return v;
    case Format::kFp8: {
      v.data = part<uint8_t>(d.data, what, "data");
      const float* si = part<float>(d.scale_inv, what, "scale_inv");
      if (q.scaling == Scaling::kBlock1x128)
        v.chunk_scale = si;  // pieces [N, K / 128] back to back
      else if (q.scaling == Scaling::kBlock128x128)
        v.chunk_scale = expand_chunks(s, si, m, K / 128, std::max<int64_t>(N, 1));
      else
        oa.src = si, v.outer = expand_outer(s, oa);
      return v;
    }
    case Format::kMxfp8:  // [groups][K][N] -> [groups][N][K]; scales [groups][K / 32][N] ->
                          // [groups][N][K / 32]
      v.data = transpose_pad<uint8_t>(s, part<uint8_t>(d.data, what, "data"), groups, K, N, N,
                                      K * N, K, 0);
      v.block_scale = transpose_pad<uint8_t>(s, part<uint8_t>(d.block_scale, what, "block_scale"),
                                             groups, K / 32, N, N, K / 32 * N, K / 32, 127);
      return v;
    default:
      throw GemmError(cat("operand ", what, ": not a quantized format"));
  }
}

}  // namespace lockstep::cuda
