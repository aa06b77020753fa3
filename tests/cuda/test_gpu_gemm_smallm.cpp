// lockstep_test_gpu --op gemm_small_m: the small-M wgmma kernel at both tile widths
// (cuda_wgmma_small_m: 64 x 32 tiles, m64n32k16; cuda_wgmma_small_m_wide: 64 x 128 tiles,
// m64n128k16) gives the output bytes of the wgmma kernels large M runs (in-loop m64n128k16, staged
// m64n256k16, W in registers with the operand roles swapped) on random inputs, dense and grouped,
// every non-chunked format pairing, F32 and BF16 outputs, the epilogues (bias, SwiGLU x router
// prob, padding rows, row amax), and edge inputs (zeros, +-max, subnormals, +-inf, NaN). This is
// the test of the hardware assumption docs/gemm.md states: an element's accumulation in a wgmma
// does not depend on the instruction's N width, the other rows of the tile or the operand roles.
// Also the routing: the automatic choice runs the small-M kernel for few rows per group, with wide
// tiles for outputs wide enough to give every SM two of them.
#include <algorithm>
#include <set>

#include "gemm/qgemm_cuda_types.h"
#include "test_gpu_gemm.h"

namespace lockstep::gpu_test {

using gemm_test::make;
using gemm_test::random_values;

namespace {

// The wgmma variants the small-M kernel is compared with. A variant that cannot take a case runs
// the family's choice instead (reported in GemmResult::variant); each distinct one is compared
// once.
const GemmVariant kRefs[] = {GemmVariant::kWgmmaInloop, GemmVariant::kWgmmaStaged,
                             GemmVariant::kWgmmaWreg128, GemmVariant::kWgmmaWreg256};

Tensor i64_tensor(const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>(v, {int64_t(v.size())}, DType::kI64);
}
Tensor f32_list(const std::vector<float>& v) {
  return Tensor::from_vector<float>(v, {int64_t(v.size())}, DType::kF32);
}

// One call of the forced variant (grouped when offsets is given).
GemmResult call(GemmVariant v, const GemmArg& a, const GemmArg& w, GemmConfig cfg,
                const Tensor* offsets) {
  force_variant(cfg, v);
  return offsets ? gpu_grouped(a, *offsets, w, cfg) : gpu_qgemm(a, w, cfg);
}

// The small-M kernel against every reference variant on one call; "" when all bytes are equal
// (NaN == NaN only where nan_equal: edge inputs, whose NaN payloads are the hardware's).
std::string small_m_equals_refs(const GemmArg& a, const GemmArg& w, const GemmConfig& cfg,
                                const Tensor* offsets, bool nan_equal) {
  std::string err;
  std::vector<GemmResult> refs;
  std::set<GemmVariant> seen;
  for (GemmVariant ref : kRefs) {
    GemmResult r = call(ref, a, w, cfg, offsets);
    if (seen.insert(ran(r)).second) refs.push_back(std::move(r));
  }
  for (GemmVariant v : {GemmVariant::kWgmmaSmallM, GemmVariant::kWgmmaSmallMWide}) {
    const GemmResult s = call(v, a, w, cfg, offsets);
    if (ran(s) != v) err += " " + kernel_label(v) + " request ran " + kernel_label(ran(s));
    for (const GemmResult& r : refs) {
      const std::string what = kernel_label(v) + " d vs " + kernel_label(ran(r));
      err += compare_t(r.d, s.d, nan_equal, what.c_str());
      if (cfg.epilogue.row_amax) err += compare_t(r.row_amax, s.row_amax, true, "row_amax");
    }
  }
  return err;
}

bool wgmma_here() {
  if (cuda::wgmma_available(64)) return true;
  skip("gemm_small_m", "no sm_90 GPU (wgmma)");
  return false;
}

std::vector<Pairing> plain_pairings() {
  std::vector<Pairing> ps;
  for (const Pairing& p : pairings())
    if (!chunked(p.a) && !chunked(p.w)) ps.push_back(p);
  return ps;
}

// The epilogue of case number i: none, bias, or bias + SwiGLU x router prob + row amax (even N).
GemmConfig epilogue_of(int i, int64_t M, int64_t N, int64_t groups, DType out) {
  GemmConfig c;
  c.out_dtype = out;
  const int kind = i % 3;
  if (kind >= 1) {
    std::vector<float> bias(static_cast<size_t>(groups * N));
    for (size_t j = 0; j < bias.size(); ++j) bias[j] = float(int(j % 11) - 5) * 0.375f;
    c.epilogue.bias = to_gpu(f32_list(bias));
  }
  if (kind == 2 && N % 2 == 0) {
    std::vector<float> prob(static_cast<size_t>(M));
    for (size_t j = 0; j < prob.size(); ++j) prob[j] = float(j % 4 + 1) * 0.25f;
    c.epilogue.swiglu = true;
    c.epilogue.router_prob = to_gpu(f32_list(prob));
    c.epilogue.row_amax = true;
  }
  return c;
}

// Dense: M x K x N over the pairings, random values, F32 and BF16 outputs.
void dense_small_m_cases() {
  std::vector<int64_t> Ms = {1, 2, 3, 15, 16, 17, 63, 64}, Ks = {64, 128, 512, 2048, 4096},
                       Ns = {1, 37, 200, 1536};
  if (g_opt.reduced) Ms = {1, 17, 64}, Ks = {64, 2048}, Ns = {37, 200};
  int idx = 0;
  for (const Pairing& p : plain_pairings())
    for (int64_t K : Ks)
      for (int64_t N : Ns) {
        const std::string wname = "gemm_small_m dense " + p.a.label + " x " + p.w.label +
                                  " N=" + std::to_string(N) + " K=" + std::to_string(K);
        bool any = false;
        for (int64_t M : Ms) any = any || selected(wname + " M=" + std::to_string(M));
        if (!any) continue;
        const uint64_t wseed = case_seed(wname);
        const DevHeld dw = dev(make(p.w, random_values(N * K, wseed, 0.05f), N, K));
        for (int64_t M : Ms) {
          const std::string name = wname + " M=" + std::to_string(M);
          const int i = idx++;
          run_case(name, [&] {
            const uint64_t seed = case_seed(name);
            const DevHeld da = dev(make(p.a, random_values(M * K, seed, 2.0f), M, K));
            std::string err;
            for (DType out : {DType::kF32, DType::kBF16}) {
              const std::string e = small_m_equals_refs(
                  da.op(), dw.op(), epilogue_of(i, M, N, 1, out), nullptr, false);
              if (!e.empty()) err += (out == DType::kF32 ? " [f32]" : " [bf16]") + e;
            }
            return err;
          });
        }
      }
}

// Grouped: groups with zero rows, padding rows, SwiGLU x router prob, bias, BF16 output; offsets
// on the host and on the device (with max_group_rows).
void grouped_small_m_cases() {
  const std::vector<std::vector<int64_t>> row_sets = {{1, 0, 0, 0, 0, 0, 0, 0},
                                                      {0, 3, 0, 17, 0, 64, 0, 2},
                                                      {16, 16, 0, 1, 0, 2, 15, 0},
                                                      {0, 0, 0, 0, 0, 0, 0, 0}};
  std::vector<std::pair<int64_t, int64_t>> nks = {{768, 512}, {200, 2048}, {1536, 128}};
  if (g_opt.reduced) nks = {{200, 2048}};
  const int64_t E = 8;
  for (const Pairing& p : plain_pairings())
    for (const auto& [N, K] : nks)
      for (const auto& rows : row_sets)
        for (int place = 0; place < 2; ++place) {
          std::vector<int64_t> off = {0};
          int64_t max_rows = 0;
          for (int64_t r : rows) off.push_back(off.back() + r), max_rows = std::max(max_rows, r);
          std::string rs;
          for (int64_t r : rows) rs += (rs.empty() ? "" : ",") + std::to_string(r);
          const std::string name = "gemm_small_m grouped " + p.a.label + " x " + p.w.label +
                                   " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                   " rows " + rs + (place == 0 ? " host" : " device+max");
          run_case(name, [&] {
            const uint64_t seed = case_seed(name);
            const int64_t M = off.back();
            const DevHeld da = dev(make(p.a, random_values(M * K, seed, 2.0f), M, K));
            const DevHeld dw = dev(make(p.w, random_values(E * N * K, seed + 1, 0.05f), E * N, K));
            std::vector<int64_t> tokens = rows;
            for (int64_t& t : tokens)
              if (t > 2) --t;  // the last row of larger groups is padding
            std::string err;
            for (int epi = 0; epi < 3; ++epi) {
              GemmConfig c = epilogue_of(epi, M, N, E, epi == 1 ? DType::kF32 : DType::kBF16);
              c.group_rows = place == 0 ? i64_tensor(tokens) : to_gpu(i64_tensor(tokens));
              if (place == 1) c.max_group_rows = max_rows;
              const Tensor offs = place == 0 ? i64_tensor(off) : to_gpu(i64_tensor(off));
              err += small_m_equals_refs(da.op(), dw.op(), c, &offs, false);
            }
            return err;
          });
        }
}

// Edge inputs: zeros (both signs), and +-inf, NaN, +-max, subnormals and huge exponents mixed in.
void edge_small_m_cases() {
  const int64_t K = 512, N = 200;
  for (const Pairing& p : plain_pairings())
    for (Dist d : {Dist::kZeros, Dist::kEdge, Dist::kNanRows})
      for (int64_t M : {int64_t(1), int64_t(16), int64_t(64)}) {
        const std::string name = "gemm_small_m edge " + std::string(dist_name(d)) + " " +
                                 p.a.label + " x " + p.w.label + " M=" + std::to_string(M);
        run_case(name, [&] {
          const uint64_t seed = case_seed(name);
          const DevHeld da = dev(make(p.a, make_values(M, K, d, false, seed), M, K));
          const DevHeld dw = dev(make(p.w, make_values(N, K, Dist::kEdge, false, seed + 1), N, K));
          std::string err;
          for (DType out : {DType::kF32, DType::kBF16})
            err +=
                small_m_equals_refs(da.op(), dw.op(), epilogue_of(1, M, N, 1, out), nullptr, true);
          return err;
        });
      }
}

// The automatic choice: the batch-invariant order runs the small-M kernel up to 32 rows (and up to
// 64 while the 128-column grid would not fill the GPU), never at 65 rows or more; the fast order
// keeps the decode kernel up to 16 rows and takes the small-M kernel from 17 to 32 (nvfp4 W).
void small_m_routing() {
  const std::string name = "gemm_small_m routing";
  if (!selected(name)) return;
  std::string err;
  const int64_t K = 512, N = 256;
  const Pairing p = pairings()[0];  // w4a16
  const DevHeld dw = dev(make(p.w, random_values(N * K, 3, 0.05f), N, K));
  for (int64_t M : {1, 16, 17, 32, 64, 65, 200}) {
    const DevHeld da = dev(make(p.a, random_values(M * K, 4, 1.0f), M, K));
    GemmConfig bi, fast;
    fast.order = GemmOrder::kFast;
    const GemmVariant got_bi = ran(gpu_qgemm(da.op(), dw.op(), bi));
    const GemmVariant got_fast = ran(gpu_qgemm(da.op(), dw.op(), fast));
    const bool small = M <= 64;  // N = 256: 2 in-loop CTAs, far from filling the GPU
    if ((got_bi == GemmVariant::kWgmmaSmallM) != small)
      err += " batch-invariant M=" + std::to_string(M) + " ran " + kernel_label(got_bi);
    const GemmVariant want_fast = M <= 16 ? GemmVariant::kDecode
                                  : small ? GemmVariant::kWgmmaSmallM
                                          : got_fast;
    if (got_fast != want_fast)
      err += " fast M=" + std::to_string(M) + " ran " + kernel_label(got_fast);
  }
  // A vocabulary-wide output at one row: 128-column tiles (N = 40,000: 313 of them, two or more
  // per SM up to 156 SMs); the bytes are those of the in-loop kernel.
  const int64_t wide_n = 40000, wide_k = 128;
  const DevHeld ww = dev(make(p.w, random_values(wide_n * wide_k, 5, 0.05f), wide_n, wide_k));
  const DevHeld wa = dev(make(p.a, random_values(wide_k, 6, 1.0f), 1, wide_k));
  const GemmResult wide = gpu_qgemm(wa.op(), ww.op(), GemmConfig{});
  if (ran(wide) != GemmVariant::kWgmmaSmallMWide)
    err += " batch-invariant M=1 N=40000 ran " + kernel_label(ran(wide));
  err += compare_t(call(GemmVariant::kWgmmaInloop, wa.op(), ww.op(), GemmConfig{}, nullptr).d,
                   wide.d, false, "N=40000 d vs in-loop");
  report(name, err);
}

}  // namespace

void test_gemm_small_m() {
  if (!want("gemm_small_m")) return;
  if (g_opt.kernel != GemmVariant::kAuto) return;  // a comparison across variants, not per kernel
  if (!wgmma_here()) return;
  small_m_routing();
  dense_small_m_cases();
  grouped_small_m_cases();
  edge_small_m_cases();
}

}  // namespace lockstep::gpu_test
