// lockstep_test_gpu --op gemm_grouped: grouped_qgemm on CUDA (SwiGLU x router prob, bias, bf16
// output, an empty expert, padding rows) against the CPU on grid inputs and against per-expert
// dense CUDA GEMMs on random inputs; the offsets and group_rows on the host and on the device (the
// device-built group table, with and without max_group_rows); and a decode chain with W preload.
#include <algorithm>
#include <cstdio>

#include "gemm/qgemm_cuda_types.h"
#include "gemm/qgemm_operand_cuda.h"
#include "test_gpu_gemm.h"

namespace lockstep::gpu_test {

using gemm_test::bf16_kind;
using gemm_test::make;
using gemm_test::q_kind;
using gemm_test::random_values;

namespace {

Tensor i64(const std::vector<int64_t>& v) {
  return Tensor::from_vector<int64_t>(v, {int64_t(v.size())}, DType::kI64);
}
Tensor f32v(const std::vector<float>& v) {
  return Tensor::from_vector<float>(v, {int64_t(v.size())}, DType::kF32);
}

// Rows [r0, r1) of a held operand on the device, as the grouped GEMM reads them: the bf16 rows,
// or the group view of its QTensor (the same codes and block scales, and the outer scale of the
// rows' domain: per row its rows, per tensor the one shared scale).
DevHeld expert_rows(const Held& h, int64_t r0, int64_t r1) {
  DevHeld d;
  d.t = h.t.slice_rows(r0, r1).to(gpu());
  if (h.q) {
    QTensor g = *h.q;
    g.group_offsets = {0, r0, r1, h.rows};
    d.q = group_view(g, 1).to(gpu());
  }
  return d;
}

// Fewer rows than groups (a decode step: 2 of 4 experts, 3 of 40): the device-built table
// visits only min(groups, rows) entries, the groups with rows first.
std::vector<int64_t> sparse_rows(int64_t groups, std::vector<std::pair<int64_t, int64_t>> busy) {
  std::vector<int64_t> rows(size_t(groups), 0);
  for (const auto& [g, r] : busy) rows[size_t(g)] = r;
  return rows;
}

void grouped_cases() {
  const int64_t N = 256, K = 256;
  const std::vector<std::vector<int64_t>> row_sets = {{1, 0, 3, 1},
                                                      {40, 0, 131, 7},
                                                      {130, 0, 200, 190},
                                                      {300, 0, 520, 260},
                                                      {24, 24, 24, 24},
                                                      {0, 0, 2, 0},
                                                      sparse_rows(40, {{3, 1}, {33, 2}, {39, 1}})};
  const std::vector<Pairing> all = pairings();
  // w4a16 and fp8 x fp8; bf16 x bf16 too where the rows are a decode step's few (its bf16 experts:
  // the decode kernel with device offsets).
  for (const auto& rows : row_sets)
    for (const Pairing& p : {all[0], all[6], all[8]})
      for (int place = 0; place < 3;
           ++place) {  // offsets: host; device with max_group_rows; device without
        std::vector<int64_t> off = {0};
        for (int64_t r : rows) off.push_back(off.back() + r);
        int64_t max_rows = 0;
        for (int64_t r : rows) max_rows = std::max(max_rows, r);
        const int64_t E = int64_t(rows.size());
        const bool bf16_pair = p.a.bf16 && p.w.bf16;
        if (bf16_pair && off.back() > 16) continue;
        std::vector<int64_t> tokens = rows;
        // The last row of expert 2 is padding (of the last expert with rows when 2 has none).
        int64_t pad = 2;
        for (int64_t e = E - 1; rows[size_t(pad)] == 0 && e >= 0; --e)
          if (rows[size_t(e)] > 0) pad = e;
        tokens[size_t(pad)] = rows[size_t(pad)] - 1;
        std::string row_list;
        for (size_t e = 0; e < rows.size(); ++e)
          if (E <= 4 || rows[e] > 0)
            row_list += (row_list.empty() ? "" : ",") +
                        (E <= 4 ? "" : "e" + std::to_string(e) + ":") + std::to_string(rows[e]);
        const std::string base = "gemm_grouped " + p.a.label + " x " + p.w.label + " rows " +
                                 (E <= 4 ? "" : std::to_string(E) + " groups ") + row_list +
                                 (place == 0   ? " host offsets"
                                  : place == 1 ? " device offsets+max"
                                               : " device offsets");
        const std::vector<GemmVariant> ks =
            kernels_for(false, place == 2 ? off.back() : max_rows, K, place == 0);
        if (ks.empty()) skip(base, "no applicable kernel");
        const uint64_t seed = case_seed(base);
        // Grid values: exact in any order, so the CUDA kernels equal the CPU grouped GEMM.
        const Held a = make(p.a, grid_values_narrow(p.a, off.back(), K, seed, 3), off.back(), K);
        const Held w = make(p.w, grid_values_narrow(p.w, E * N, K, seed + 1, 5), E * N, K);
        if (bf16_pair && !any_order_exact(a.op(), w.op())) {
          skip(base, "grid values whose products do not sum exactly in every order");
          continue;
        }
        std::vector<float> prob(size_t(off.back())), bias(size_t(E * N));
        for (size_t i = 0; i < prob.size(); ++i) prob[i] = float(i % 4 + 1) * 0.25f;
        for (size_t i = 0; i < bias.size(); ++i) bias[i] = float(int(i % 7) - 3) * 0.5f;
        GemmConfig cfg;
        cfg.epilogue.swiglu = true;
        cfg.epilogue.row_amax = true;
        cfg.epilogue.router_prob = f32v(prob);
        cfg.epilogue.bias = f32v(bias);
        cfg.out_dtype = DType::kBF16;
        cfg.group_rows = i64(tokens);
        const GemmResult cpu = grouped_qgemm(a.op(), i64(off), w.op(), cfg);
        const DevHeld da = dev(a), dw = dev(w);
        GemmConfig gcfg = cfg;
        gcfg.epilogue.router_prob = to_gpu(cfg.epilogue.router_prob);
        gcfg.epilogue.bias = to_gpu(cfg.epilogue.bias);
        if (place > 0) gcfg.group_rows = to_gpu(cfg.group_rows);
        if (place == 1) gcfg.max_group_rows = max_rows;
        const Tensor offs = place == 0 ? i64(off) : to_gpu(i64(off));
        for (GemmVariant k : ks) {
          const std::string name = base + " " + kernel_label(k);
          run_case(name, [&] {
            std::string err;
            force_variant(gcfg, k);
            const GemmResult g = gpu_grouped(da.op(), offs, dw.op(), gcfg);
            if (!kernel_matches(k, ran(g))) err += " ran " + kernel_label(ran(g));
            err += compare_t(cpu.d, g.d, false, "d") +
                   compare_t(cpu.row_amax, g.row_amax, true, "row_amax");
            return err;
          });
        }
        // Random values: each group equals the dense CUDA GEMM of its rows on the same kernel.
        // The dense operands are row slices of the grouped ones (expert_rows), never quantized
        // again: a per_tensor W has one scale for all experts, which re-quantizing one expert's
        // rows alone would not reproduce.
        if (place != 0) continue;
        const Held ar = make(p.a, random_values(off.back() * K, seed + 2, 1.0f), off.back(), K);
        const Held wr = make(p.w, random_values(E * N * K, seed + 3, 0.05f), E * N, K);
        const DevHeld dar = dev(ar), dwr = dev(wr);
        for (GemmVariant k : ks) {
          const std::string name = base + " == per-expert dense " + kernel_label(k);
          run_case(name, [&] {
            std::string err;
            GemmConfig c;
            force_variant(c, k);
            const std::vector<float> grouped =
                to_f32(gpu_grouped(dar.op(), i64(off), dwr.op(), c).d);
            for (int64_t e = 0; e < E; ++e) {
              if (rows[size_t(e)] == 0) continue;
              const DevHeld dae = expert_rows(ar, off[size_t(e)], off[size_t(e + 1)]),
                            dwe = expert_rows(wr, e * N, (e + 1) * N);
              if (!applicable(k, false, rows[size_t(e)], K, true)) continue;
              const std::vector<float> dense = to_f32(gpu_qgemm(dae.op(), dwe.op(), c).d);
              for (size_t i = 0; i < dense.size(); ++i)
                if (num::f32_bits(dense[i]) !=
                    num::f32_bits(grouped[size_t(off[size_t(e)] * N) + i])) {
                  err += " expert " + std::to_string(e) + " differs";
                  break;
                }
            }
            return err;
          });
        }
      }
}

// W preload (GemmOperandView::preload): a chain of grouped decode GEMMs as a MoE decode step runs
// them (FC1 + SwiGLU -> FC2 -> the next layer's FC1, each reading the previous output as A,
// launched back to back with programmatic dependent launch) with W preload set and unset, and with
// a synchronisation after every call: every layer's output has the same bytes.
void decode_preload() {
  if (g_opt.kernel != GemmVariant::kAuto && g_opt.kernel != GemmVariant::kDecode) return;
  const int64_t E = 4, H = 2304, I = 384, L = 3;
  std::vector<Kind> kinds = {q_kind(Format::kNvfp4, Scaling::kPerRow),
                             q_kind(Format::kMxfp8, Scaling::kBlock1x32),
                             q_kind(Format::kFp8, Scaling::kPerRow)};
  if (g_opt.reduced) kinds.resize(1);
  for (const Kind& wk : kinds) {
    const std::string name = "gemm_grouped decode preload chain w " + wk.label;
    if (!selected(name)) continue;
    const uint64_t seed = case_seed(name);
    std::vector<DevHeld> fc1, fc2;
    for (int64_t l = 0; l < L; ++l) {
      fc1.push_back(dev(
          make(wk, random_values(E * 2 * I * H, seed + 40 + uint64_t(l), 0.05f), E * 2 * I, H)));
      fc2.push_back(
          dev(make(wk, random_values(E * H * I, seed + 50 + uint64_t(l), 0.05f), E * H, I)));
    }
    const Tensor x = to_gpu(from_f32(random_values(E * H, seed + 60, 1.0f), {E, H}, DType::kBF16));
    std::vector<int64_t> off(size_t(E + 1));
    for (int64_t e = 0; e <= E; ++e) off[size_t(e)] = e;
    cudaStream_t cs;
    if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess) {
      report(name, " no stream");
      continue;
    }
    const Stream st{cs};
    std::string err;
    try {
      cuda::Scratch scratch(gpu(), st);
      std::vector<cuda::GemmOperandView> w1, w2;
      for (int64_t l = 0; l < L; ++l) {
        w1.push_back(cuda::prepare_operand(fc1[size_t(l)].op(), Copy::kRowwise, "fc1", scratch));
        w2.push_back(cuda::prepare_operand(fc2[size_t(l)].op(), Copy::kRowwise, "fc2", scratch));
      }
      const cuda::DeviceGroupTable t1 = cuda::make_group_table(off, 2 * I, {}, gpu(), st);
      const cuda::DeviceGroupTable t2 = cuda::make_group_table(off, H, {}, gpu(), st);
      // mode 0: preload unset, 1: set, 2: set and synchronised after every call.
      auto run = [&](int mode) {
        std::vector<Tensor> h, y;
        for (int64_t l = 0; l < L; ++l) {
          h.push_back(Tensor::empty(DType::kBF16, {E, I}, gpu(), st));
          y.push_back(Tensor::empty(DType::kBF16, {E, H}, gpu(), st));
          h.back().fill_bytes(0xFF, st), y.back().fill_bytes(0xFF, st);  // poison
        }
        for (int64_t l = 0; l < L; ++l) {
          cuda::GemmOperandView a1, a2, v1 = w1[size_t(l)], v2 = w2[size_t(l)];
          v1.preload = v2.preload = mode != 0;
          a1.format = a2.format = Format::kBf16;
          a1.rows = a2.rows = E, a1.cols = H, a2.cols = I;
          a1.data = l == 0 ? x.raw() : y[size_t(l - 1)].raw();
          a2.data = h[size_t(l)].raw();
          cuda::DeviceEpilogue ep1, ep2;
          ep1.swiglu = true, ep1.out_bf16 = true, ep2.out_bf16 = true;
          cuda::GemmOutView o1, o2;
          o1.d_bf16 = h[size_t(l)].ptr<uint16_t>(), o2.d_bf16 = y[size_t(l)].ptr<uint16_t>();
          cuda::qgemm_device(a1, v1, 2 * I, t1, ep1, o1, scratch, GemmVariant::kDecode,
                             GemmOrder::kBatchInvariant, cs);
          if (mode == 2) synchronize(gpu(), st);
          cuda::qgemm_device(a2, v2, H, t2, ep2, o2, scratch, GemmVariant::kDecode,
                             GemmOrder::kBatchInvariant, cs);
          if (mode == 2) synchronize(gpu(), st);
        }
        std::vector<uint16_t> all;
        for (int64_t l = 0; l < L; ++l)
          for (const Tensor* b : {&h[size_t(l)], &y[size_t(l)]}) {
            const Tensor hb = b->to(Device::cpu(), st);
            all.insert(all.end(), hb.data<uint16_t>().begin(), hb.data<uint16_t>().end());
          }
        return all;
      };
      const std::vector<uint16_t> off_bits = run(0), on_bits = run(1), sync_bits = run(2);
      bool finite = true;  // every element was written (no 0xFFFF poison left) and is finite
      for (uint16_t b : off_bits) finite = finite && (b & 0x7F80u) != 0x7F80u;
      if (!finite || off_bits.size() != size_t(L * E * (I + H)))
        err += " an output was not written or not finite";
      if (on_bits != off_bits) err += " preload set != unset";
      if (sync_bits != off_bits) err += " synchronised calls != back to back";
      synchronize(gpu(), st);
    } catch (const std::exception& e) {
      err += std::string(" threw: ") + e.what();
    }
    cudaStreamDestroy(cs);
    report(name, err);
  }
}

}  // namespace

void test_gemm_grouped() {
  if (!want("gemm_grouped")) return;
  grouped_cases();
  decode_preload();
}

}  // namespace lockstep::gpu_test
