// Host side of the CUDA GEMMs (qgemm_cuda.h): operand upload (validation through the CPU decoder's
// checks, compact scales, per-row outer scales), group tables, kernel choice, and the host
// convenience wrappers with qgemm.h's signatures.
#include <algorithm>

#include "lockstep/quant/layout.h"
#include "qgemm_cuda.cuh"

namespace lockstep::cuda {
namespace {

int64_t domain_of(const QTensor& q, int64_t r) {
  if (q.scaling == Scaling::kPerRow) return r;
  if (q.scaling == Scaling::kPerGroup)
    for (size_t g = 0; g + 1 < q.group_offsets.size(); ++g)
      if (r < q.group_offsets[g + 1]) return int64_t(g);
  return 0;
}

// MXFP8 inner values are bf16 numbers only for these block exponents (docs/gemm.md section 2).
void check_mxfp8_bf16_exact(const GemmOperand& op) {
  const QTensor& q = *op.q;
  const int lo = q.elem == ElemCodec::kE5M2 ? 10 : 3, hi = q.elem == ElemCodec::kE5M2 ? 239 : 246;
  for (int64_t r = 0; r < q.scale_rows; ++r)
    for (int64_t c = 0; c < q.scale_cols; ++c) {
      const uint8_t e = q.scale_layout == ScaleLayout::kCompact
                            ? q.block_scale[size_t(r * q.scale_cols + c)]
                            : q.block_scale[size_t(swizzled_offset(r, c, round_up(q.scale_cols, 4)))];
      if (e < lo || e > hi)
        throw GemmError(gemm_detail::cat("operand ", op.describe(), ": mxfp8 block exponent ", int(e), " at block (", r, ", ", c, ") is outside ", lo, "..", hi, ", where the inner values are exact in bf16; the cuda GEMM refuses it (use the cpu)"));
    }
}

}  // namespace

DeviceGemmOperand upload_gemm_operand(const GemmOperand& op, cudaStream_t s) {
  (void)decode_gemm_operand(op, 0, 0);  // the CPU decoder's validation: sizes, block divisibility of K
  DeviceGemmOperand d;
  d.name = op.name;
  GemmOperandView& v = d.view;
  v.format = op.format();
  v.rows = op.n_rows();
  v.cols = op.n_cols();
  if (!op.q) {
    std::vector<uint16_t> bits(op.dense.size());
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = num::f32_to_bf16(op.dense[i]);
    d.data.upload(std::span<const uint16_t>(bits.data(), bits.size()));
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
    v.data = d.data.get();
    return d;
  }
  const QTensor& q = *op.q;
  v.elem = q.elem;
  std::vector<float> outer(size_t(q.rows), 1.0f);
  const bool chunked = q.format == Format::kFp8 && (q.scaling == Scaling::kBlock1x128 || q.scaling == Scaling::kBlock128x128);
  if (q.format == Format::kMxfp8) check_mxfp8_bf16_exact(op);
  for (int64_t r = 0; r < q.rows; ++r) {
    if (q.format == Format::kNvfp4)
      outer[size_t(r)] = num::two_level_outer(q.amax[size_t(domain_of(q, r))], num::kE2M1Max).s_dec;
    else if (q.format == Format::kFp8 && !chunked)
      outer[size_t(r)] = q.scale_inv[size_t(domain_of(q, r))];
  }
  if (chunked) {  // outer 1; scale_inv of (r, chunk c) expanded to [rows, K/128] (docs/gemm.md section 2)
    const int64_t chunks = q.cols / kGemmChunk;
    std::vector<float> cs(size_t(q.rows * chunks));
    for (int64_t r = 0; r < q.rows; ++r) {
      const int64_t sr = q.scaling == Scaling::kBlock1x128 ? r : r / 128;
      for (int64_t c = 0; c < chunks; ++c) cs[size_t(r * chunks + c)] = q.scale_inv[size_t(sr * chunks + c)];
    }
    d.chunk_scale.upload(std::span<const float>(cs.data(), cs.size()));
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));  // cs dies here
  }
  d.data.upload(std::span<const uint8_t>(q.data.data(), q.data.size()));
  if (q.format != Format::kFp8) {
    std::vector<uint8_t> compact(size_t(q.scale_rows * q.scale_cols));
    for (int64_t r = 0; r < q.scale_rows; ++r)
      for (int64_t c = 0; c < q.scale_cols; ++c)
        compact[size_t(r * q.scale_cols + c)] =
            q.scale_layout == ScaleLayout::kCompact
                ? q.block_scale[size_t(r * q.scale_cols + c)]
                : q.block_scale[size_t(swizzled_offset(r, c, round_up(q.scale_cols, 4)))];
    d.block_scale.upload(std::span<const uint8_t>(compact.data(), compact.size()));
  }
  d.outer.upload(std::span<const float>(outer.data(), outer.size()));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));  // host vectors above die here
  v.data = d.data.get();
  v.block_scale = d.block_scale.empty() ? nullptr : d.block_scale.as<uint8_t>();
  v.outer = d.outer.empty() ? nullptr : d.outer.as<float>();
  v.chunk_scale = d.chunk_scale.empty() ? nullptr : d.chunk_scale.as<float>();
  return d;
}

DeviceGroupTable make_group_table(std::span<const int64_t> offsets, int64_t n_per_group,
                                  std::span<const int64_t> group_rows, cudaStream_t s) {
  if (offsets.size() < 2 || offsets.front() != 0)
    throw GemmError(gemm_detail::cat("group offsets need >= 2 entries starting at 0 (got ", offsets.size(), ")"));
  DeviceGroupTable t;
  t.groups = int(offsets.size() - 1);
  std::vector<GemmGroupDesc> host(size_t(t.groups));
  for (int e = 0; e < t.groups; ++e) {
    const int64_t rows = offsets[size_t(e + 1)] - offsets[size_t(e)];
    if (rows < 0) throw GemmError(gemm_detail::cat("group offsets decrease at group ", e));
    if (rows > INT32_MAX) throw GemmError(gemm_detail::cat("group ", e, " has ", rows, " rows (max ", INT32_MAX, ")"));
    host[size_t(e)] = GemmGroupDesc{offsets[size_t(e)], int64_t(e) * n_per_group, int32_t(rows),
                                    int32_t(group_rows.empty() ? rows : group_rows[size_t(e)])};
    t.max_rows = std::max(t.max_rows, rows);
  }
  t.total_rows = offsets.back();
  t.host = host;
  t.table.upload(std::span<const GemmGroupDesc>(host.data(), host.size()), s);
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  return t;
}

DeviceGroupTable make_dense_table(int64_t m, cudaStream_t s) {
  const int64_t off[2] = {0, m};
  return make_group_table(off, 0, {}, s);
}

bool qgemm_cublas_available() { return gemm_detail::cublas_available(); }
bool qgemm_wgmma_available(int64_t k) { return gemm_detail::wgmma_supported(k); }

const char* qgemm_kernel_name(QgemmKernel k) {
  switch (k) {
    case QgemmKernel::kDecode: return "cuda_decode";
    case QgemmKernel::kTiled: return "cuda_tiled";
    case QgemmKernel::kCublas: return "cuda_cublas";
    case QgemmKernel::kWgmma: return "cuda_wgmma";
    case QgemmKernel::kFast: return "cuda_fast";
    default: return "cuda_auto";
  }
}

namespace {
// Whether the decode kernel takes W of format wf with at most max_rows rows per group and K = k
// (kAuto and kFast alike pick it then).
bool decode_takes(Format wf, int64_t k, int64_t max_rows) {
  return max_rows <= gemm_detail::kDecodeMaxRows && k % 128 == 0 && wf != Format::kBf16 &&
         gemm_detail::decode_fits(wf, k, max_rows);
}
}  // namespace

QgemmKernel qgemm_pick_kernel(const GemmOperandView& a, const GemmOperandView& w, const DeviceGroupTable& g) {
  if (a.chunk_scale || w.chunk_scale) return QgemmKernel::kTiled;
  if (decode_takes(w.format, w.cols, g.max_rows)) return QgemmKernel::kDecode;
  return gemm_detail::wgmma_supported(w.cols) ? QgemmKernel::kWgmma : QgemmKernel::kTiled;
}

QgemmKernel qgemm_fast_kernel(Format wf, int64_t groups, int64_t max_rows, int64_t k) {
  if (decode_takes(wf, k, max_rows)) return QgemmKernel::kDecode;
  const bool wg = gemm_detail::wgmma_supported(k), cb = gemm_detail::cublas_available() && k % 16 == 0;
  const bool prefer_wg = wf == Format::kNvfp4 || wf == Format::kFp8 || (groups > 1 && wf == Format::kMxfp8);
  if (prefer_wg && wg) return QgemmKernel::kWgmma;
  if (cb) return QgemmKernel::kCublas;
  return wg ? QgemmKernel::kWgmma : QgemmKernel::kTiled;
}

QgemmKernel qgemm_pick_fast(const GemmOperandView& a, const GemmOperandView& w, const DeviceGroupTable& g) {
  if (a.chunk_scale || w.chunk_scale) return QgemmKernel::kTiled;
  return qgemm_fast_kernel(w.format, g.groups, g.max_rows, w.cols);
}

void qgemm_device(const GemmOperandView& a, const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                  const DeviceEpilogue& ep, GemmOutView out, DeviceBuffer& workspace, QgemmKernel kernel,
                  cudaStream_t stream) {
  if (a.cols != w.cols)
    throw GemmError(gemm_detail::cat("qgemm cuda: A has K = ", a.cols, " but W has K = ", w.cols));
  if (ep.swiglu && n % 2 != 0) throw GemmError(gemm_detail::cat("qgemm cuda: swiglu needs an even N (got ", n, ")"));
  if (!out.d_f32 == !out.d_bf16) throw GemmError("qgemm cuda: give exactly one of d_f32 / d_bf16");
  if (kernel == QgemmKernel::kAuto) kernel = qgemm_pick_kernel(a, w, groups);
  if (kernel == QgemmKernel::kFast) kernel = qgemm_pick_fast(a, w, groups);
  if ((a.chunk_scale || w.chunk_scale) && kernel != QgemmKernel::kTiled)
    throw GemmError(gemm_detail::cat("qgemm cuda: fp8 block scaling (1x128 / 128x128: per-128 k chunk scales) runs only on the tiled kernel, not ", qgemm_kernel_name(kernel)));
  if (kernel == QgemmKernel::kDecode)
    gemm_detail::launch_decode(a, w, n, groups, ep, out, workspace, stream);
  else if (kernel == QgemmKernel::kWgmma)
    gemm_detail::launch_wgmma(a, w, n, groups, ep, out, workspace, stream);
  else if (kernel == QgemmKernel::kCublas)
    gemm_detail::launch_cublas(a, w, n, groups, ep, out, workspace, stream);
  else
    gemm_detail::launch_tiled(a, w, n, groups, ep, out, workspace, stream);
}

namespace {

GemmResult run_host(const GemmOperand& a, std::span<const int64_t> offsets, const GemmOperand& w, int64_t n,
                    const GemmEpilogue& ep, std::span<const int64_t> group_rows, QgemmKernel kernel) {
  const int64_t groups = int64_t(offsets.size()) - 1;
  if (!ep.bias.empty() && int64_t(ep.bias.size()) != groups * n)
    throw GemmError(gemm_detail::cat("qgemm cuda: bias has ", ep.bias.size(), " values, want ", groups * n));
  if (!ep.router_prob.empty() && int64_t(ep.router_prob.size()) != a.n_rows())
    throw GemmError(gemm_detail::cat("qgemm cuda: router_prob has ", ep.router_prob.size(), " values, want ", a.n_rows()));
  DeviceGemmOperand da = upload_gemm_operand(a), dw = upload_gemm_operand(w);
  DeviceGroupTable table = make_group_table(offsets, n, group_rows);
  DeviceBuffer bias, prob, out, ws;
  DeviceEpilogue dep;
  dep.alpha = ep.alpha;
  dep.swiglu = ep.swiglu;
  dep.out_bf16 = ep.out_bf16;
  if (!ep.bias.empty()) bias.upload(ep.bias), dep.bias = bias.as<float>();
  if (!ep.router_prob.empty()) prob.upload(ep.router_prob), dep.router_prob = prob.as<float>();
  GemmResult r;
  r.rows = a.n_rows();
  r.cols = ep.swiglu ? n / 2 : n;
  const size_t count = size_t(r.rows * r.cols);
  out.resize(std::max<size_t>(count * (ep.out_bf16 ? 2 : 4), 4));
  out.fill(0xFF);  // poison: every element must be written
  GemmOutView ov;
  if (ep.out_bf16)
    ov.d_bf16 = out.as<uint16_t>();
  else
    ov.d_f32 = out.as<float>();
  qgemm_device(da.view, dw.view, n, table, dep, ov, ws, kernel);
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  if (ep.out_bf16) {
    std::vector<uint16_t> h = out.download<uint16_t>();
    r.d_bf16.assign(h.begin(), h.begin() + count);
    r.d.resize(count);
    for (size_t i = 0; i < count; ++i) r.d[i] = num::bf16_to_f32(r.d_bf16[i]);
  } else {
    std::vector<float> h = out.download<float>();
    r.d.assign(h.begin(), h.begin() + count);
  }
  if (ep.row_amax) {
    r.row_amax.resize(size_t(r.rows));
    for (int64_t i = 0; i < r.rows; ++i) {
      float m = num::amax_empty();
      for (int64_t c = 0; c < r.cols; ++c) m = num::amax_fold(m, r.d[size_t(i * r.cols + c)]);
      r.row_amax[size_t(i)] = r.cols == 0 ? 0.0f : m;
    }
  }
  return r;
}

}  // namespace

GemmResult qgemm_cuda(const GemmOperand& a, const GemmOperand& w, const GemmEpilogue& ep, QgemmKernel kernel) {
  const int64_t off[2] = {0, a.n_rows()};
  return run_host(a, off, w, w.n_rows(), ep, {}, kernel);
}

GemmResult grouped_qgemm_cuda(const GemmOperand& a, std::span<const int64_t> offsets, const GemmOperand& w,
                              const GemmEpilogue& ep, std::span<const int64_t> group_rows, QgemmKernel kernel) {
  if (offsets.size() < 2 || offsets.back() != a.n_rows())
    throw GemmError(gemm_detail::cat("grouped qgemm cuda: offsets must run from 0 to A's rows ", a.n_rows()));
  const int64_t E = int64_t(offsets.size()) - 1;
  if (w.n_rows() % E != 0) throw GemmError(gemm_detail::cat("grouped qgemm cuda: W rows ", w.n_rows(), " are not ", E, " x N"));
  if (!group_rows.empty() && int64_t(group_rows.size()) != E)
    throw GemmError(gemm_detail::cat("grouped qgemm cuda: group_rows has ", group_rows.size(), " entries, want ", E));
  return run_host(a, offsets, w, w.n_rows() / E, ep, group_rows, kernel);
}

}  // namespace lockstep::cuda
