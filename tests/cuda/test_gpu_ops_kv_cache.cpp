// lockstep_test_gpu --op kv_cache / attention_cached: the KV cache entries on CUDA against the CPU,
// bit for bit: kv_round_inplace and kv_cache_write (codes and scales, bf16 and fp8, normal / edge /
// zero / NaN-row values, I32 and I64 indices, device indices out of range skipped), and
// attention_cached on both kernel schedules (warp, split) and every heads-per-call choice, against
// the CPU (NaN == NaN) and against the GPU learner's kRowwise attention on kv_round_inplace'd K /
// V; device indices out of range give NaN rows. cached_qkv_prologue (one kernel) against the CPU's
// split_cols -> rmsnorm -> rope_inplace -> kv_cache_write, and against the same four entries on
// the GPU where indices fall outside the rope table or the cache. Outputs poisoned, every GPU run
// done twice.
#include <algorithm>
#include <cmath>
#include <random>
#include <span>

#include "lockstep/ops/layout.h"
#include "lockstep/ops/tensor_ops.h"
#include "ops/attention_cuda.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

namespace {

using ops::KvDtype;
namespace ac = ops::attention_cuda;

const char* kv_name(KvDtype d) { return d == KvDtype::kBf16 ? "bf16" : "fp8"; }

Tensor index_tensor(const std::vector<int64_t>& v, bool i64) {
  if (i64) return Tensor::from_vector<int64_t>(v, {int64_t(v.size())}, DType::kI64);
  std::vector<int32_t> w(v.begin(), v.end());
  return Tensor::from_vector<int32_t>(w, {int64_t(w.size())}, DType::kI32);
}

// `rows` distinct (slot, position) cells of a [slots, max_pos] cache in an order drawn from g.
void distinct_cells(int64_t rows, int64_t slots, int64_t max_pos, std::mt19937_64& g,
                    std::vector<int64_t>& s, std::vector<int64_t>& p) {
  std::vector<int64_t> cells(size_t(slots * max_pos));
  for (size_t i = 0; i < cells.size(); ++i) cells[i] = int64_t(i);
  std::shuffle(cells.begin(), cells.end(), g);
  for (int64_t r = 0; r < rows; ++r)
    s.push_back(cells[size_t(r)] / max_pos), p.push_back(cells[size_t(r)] % max_pos);
}

// The two layers' bytes; with nan_equal, two bf16 NaN codes match whatever their sign and payload
// (a NaN the arithmetic makes has the CPU's or the GPU's pattern).
std::string compare_layers(const ops::KvCacheLayer& a, const ops::KvCacheLayer& b,
                           bool nan_equal = false) {
  return compare_t(a.k, b.k, nan_equal, "k codes") + compare_t(a.v, b.v, nan_equal, "v codes") +
         compare_t(a.k_scale, b.k_scale, false, "k scales") +
         compare_t(a.v_scale, b.v_scale, false, "v scales");
}

void round_cases() {
  struct Shape2 {
    int64_t hkv, D;
  };
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3})
    for (Shape2 s : {Shape2{4, 128}, Shape2{2, 64}, Shape2{1, 16}, Shape2{3, 24}, Shape2{1, 256}})
      for (int64_t rows : {int64_t(1), int64_t(7), int64_t(333)})
        for (Dist d : {Dist::kNormal, Dist::kEdge, Dist::kZeros, Dist::kNanRows}) {
          if (g_opt.reduced && rows != 7) continue;
          const std::string name = std::string("kv_cache round ") + kv_name(dt) + " " +
                                   std::to_string(rows) + "x" + std::to_string(s.hkv) + "x" +
                                   std::to_string(s.D) + " " + dist_name(d);
          run_case(name, [&] {
            const Tensor x = host_tensor(make_values(rows, s.hkv * s.D, d, false, case_seed(name)),
                                         rows, s.hkv * s.D, false);
            Tensor c = x.clone();
            ops::kv_round_inplace(c, s.hkv, dt);
            Tensor g1 = to_gpu(x), g2 = to_gpu(x);
            ops::kv_round_inplace(g1, s.hkv, dt);
            ops::kv_round_inplace(g2, s.hkv, dt);
            return compare_t(c, g1, true, "rounded") + compare_t(g1, g2, false, "rerun");
          });
        }
}

void write_cases() {
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3})
    for (int64_t D : {int64_t(16), int64_t(24), int64_t(128), int64_t(256)})
      for (Dist d : {Dist::kNormal, Dist::kEdge, Dist::kNanRows})
        for (int idx : {0, 1, 2}) {  // I64 / I32 / slots I32 with positions I64
          const int64_t hkv = D == 256 ? 1 : 4, slots = 3, max_pos = 50, rows = 40;
          const std::string name = std::string("kv_cache write ") + kv_name(dt) + " " +
                                   std::to_string(hkv) + "x" + std::to_string(D) + " " +
                                   dist_name(d) + " idx" + std::to_string(idx);
          run_case(name, [&] {
            std::mt19937_64 g(case_seed(name));
            const int64_t W = hkv * D;
            const Tensor k = host_tensor(make_values(rows, W, d, false, g()), rows, W, false);
            const Tensor v = host_tensor(make_values(rows, W, d, false, g()), rows, W, false);
            // Distinct (slot, position) pairs; on the device three more rows out of range.
            std::vector<int64_t> s, p;
            distinct_cells(rows, slots, max_pos, g, s, p);
            ops::KvCacheLayer c = ops::kv_cache_layer(slots, max_pos, hkv, D, dt);
            ops::kv_cache_write(c, k, v, index_tensor(s, idx != 1), index_tensor(p, idx == 0));
            std::vector<int64_t> sd = s, pd = p;
            sd[3] = -1, sd[9] = slots, pd[17] = max_pos;  // skipped on the device
            std::string err;
            for (int run = 0; run < 2; ++run) {
              ops::KvCacheLayer gl = ops::kv_cache_layer(slots, max_pos, hkv, D, dt, gpu());
              ops::kv_cache_write(gl, to_gpu(k), to_gpu(v), to_gpu(index_tensor(s, idx != 1)),
                                  to_gpu(index_tensor(p, idx == 0)));
              err += compare_layers(c, gl);
            }
            // The CPU layer of the in-range rows only, against the device write with bad rows.
            std::vector<float> kk, vv;
            std::vector<int64_t> ks, kp;
            const auto kh = k.data<float>(), vh = v.data<float>();
            for (int64_t r = 0; r < rows; ++r) {
              if (r == 3 || r == 9 || r == 17) continue;
              kk.insert(kk.end(), kh.begin() + r * W, kh.begin() + (r + 1) * W);
              vv.insert(vv.end(), vh.begin() + r * W, vh.begin() + (r + 1) * W);
              ks.push_back(s[size_t(r)]), kp.push_back(p[size_t(r)]);
            }
            ops::KvCacheLayer c2 = ops::kv_cache_layer(slots, max_pos, hkv, D, dt);
            ops::kv_cache_write(c2, host_tensor(kk, rows - 3, W, false),
                                host_tensor(vv, rows - 3, W, false), index_tensor(ks, true),
                                index_tensor(kp, true));
            ops::KvCacheLayer gb = ops::kv_cache_layer(slots, max_pos, hkv, D, dt, gpu());
            ops::kv_cache_write(gb, to_gpu(k), to_gpu(v), to_gpu(index_tensor(sd, true)),
                                to_gpu(index_tensor(pd, true)));
            return err + compare_layers(c2, gb);
          });
        }
}

// split_cols -> rmsnorm (q, k heads) -> rope_inplace (q, k) -> kv_cache_write (k, v) on the
// tensors' device: what cached_qkv_prologue must equal.
Tensor prologue_sequence(const Tensor& qkv, const Tensor& qn, const Tensor& kn, double eps,
                         const Tensor& pos, const ops::RopeTable& rope, ops::KvCacheLayer& L,
                         const Tensor& slots, int64_t hq) {
  const int64_t T = qkv.size(0), hkv = L.kv_heads(), D = L.head_dim();
  std::vector<Tensor> p = ops::split_cols(qkv, {hq * D, hkv * D, hkv * D});
  Tensor q = ops::rmsnorm(p[0].view({T * hq, D}), qn, eps, nullptr).view({T, hq * D});
  Tensor k = ops::rmsnorm(p[1].view({T * hkv, D}), kn, eps, nullptr).view({T, hkv * D});
  ops::rope_inplace(q, pos, hq, rope);
  ops::rope_inplace(k, pos, hkv, rope);
  ops::kv_cache_write(L, k, p[2].contiguous(), slots, pos);
  return q;
}

void prologue_cases() {
  struct Dims {
    int64_t hq, hkv, D;
  };
  const std::vector<Dims> dims{{4, 2, 64}, {8, 1, 128}, {6, 3, 24}, {2, 1, 256}, {32, 4, 128}};
  const double eps = 1e-6;
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3})
    for (const Dims& dm : dims)
      for (int64_t T : {int64_t(1), int64_t(5), int64_t(33)})
        for (Dist d : {Dist::kNormal, Dist::kEdge, Dist::kNanRows}) {
          if (g_opt.reduced && T != 5) continue;
          const std::string name = std::string("kv_cache prologue ") + kv_name(dt) + " " +
                                   std::to_string(dm.hq) + "/" + std::to_string(dm.hkv) + "x" +
                                   std::to_string(dm.D) + " tokens " + std::to_string(T) + " " +
                                   dist_name(d);
          run_case(name, [&] {
            const int64_t slots = 3, max_pos = 40, W = (dm.hq + 2 * dm.hkv) * dm.D;
            std::mt19937_64 g(case_seed(name));
            const Tensor qkv = host_tensor(make_values(T, W, d, false, g()), T, W, false);
            const Tensor qn =
                host_tensor(make_values(1, dm.D, Dist::kNormal, false, g()), 1, dm.D, false)
                    .view({dm.D});
            const Tensor kn =
                host_tensor(make_values(1, dm.D, Dist::kNormal, false, g()), 1, dm.D, false)
                    .view({dm.D});
            std::vector<int64_t> sv, pv;
            distinct_cells(T, slots, max_pos, g, sv, pv);
            // I64 slots at 5 tokens, I32 at 1 and 33 (the reduced set runs 5).
            const Tensor s = index_tensor(sv, T == 5), p = index_tensor(pv, false);
            const ops::RopeTable rope = ops::rope_table(64, dm.D, 1e6, DType::kF32);
            ops::KvCacheLayer c = ops::kv_cache_layer(slots, max_pos, dm.hkv, dm.D, dt);
            const Tensor qc = prologue_sequence(qkv, qn, kn, eps, p, rope, c, s, dm.hq);
            const ops::RopeTable rg = rope.to(gpu());
            std::string err;
            Tensor first;
            for (int run = 0; run < 2; ++run) {
              ops::KvCacheLayer gl = ops::kv_cache_layer(slots, max_pos, dm.hkv, dm.D, dt, gpu());
              set_poison_device_allocations(true);
              const Tensor qg = ops::cached_qkv_prologue(to_gpu(qkv), to_gpu(qn), to_gpu(kn), eps,
                                                         to_gpu(p), rg, gl, to_gpu(s), dm.hq);
              set_poison_device_allocations(false);
              err += compare_t(qc, qg, true, "q") + compare_layers(c, gl, true);
              if (run == 1) err += compare_t(first, qg, false, "rerun q");
              first = qg;
            }
            return err;
          });
        }
  // Indices the device does not check: a slot outside the cache, a position past the cache but
  // inside the rope table, one past both, and a rope table shorter than the cache (a NaN K row is
  // stored). The fused kernel equals the four entries run on the GPU.
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3})
    for (int64_t rope_rows : {int64_t(64), int64_t(30)}) {
      const std::string name = std::string("kv_cache prologue bad indices ") + kv_name(dt) +
                               " rope " + std::to_string(rope_rows);
      run_case(name, [&] {
        const int64_t hq = 4, hkv = 2, D = 64, T = 7, slots = 3, max_pos = 40;
        const int64_t W = (hq + 2 * hkv) * D;
        const Tensor qkv = to_gpu(
            host_tensor(make_values(T, W, Dist::kNormal, false, case_seed(name)), T, W, false));
        const Tensor qn = to_gpu(
            host_tensor(make_values(1, D, Dist::kNormal, false, case_seed(name) + 1), 1, D, false)
                .view({D}));
        const Tensor kn = to_gpu(
            host_tensor(make_values(1, D, Dist::kNormal, false, case_seed(name) + 2), 1, D, false)
                .view({D}));
        const Tensor s = to_gpu(index_tensor({0, -1, 1, 2, 3, 1, 2}, true));
        const Tensor p = to_gpu(index_tensor({3, 0, 50, 70, 5, 35, 39}, false));
        const ops::RopeTable rope = ops::rope_table(rope_rows, D, 1e6, DType::kF32).to(gpu());
        ops::KvCacheLayer a = ops::kv_cache_layer(slots, max_pos, hkv, D, dt, gpu());
        ops::KvCacheLayer b = ops::kv_cache_layer(slots, max_pos, hkv, D, dt, gpu());
        const Tensor qa = prologue_sequence(qkv, qn, kn, 1e-6, p, rope, a, s, hq);
        const Tensor qb = ops::cached_qkv_prologue(qkv, qn, kn, 1e-6, p, rope, b, s, hq);
        return compare_t(qa, qb, false, "q") + compare_layers(a, b);
      });
    }
}

struct CacheSetup {
  ops::KvCacheLayer cpu, gpu_layer;
  Tensor k_rows, v_rows;  // host F32 [slots * max_pos, Hkv D], slot-major
};

// Every position of every slot written with values of `d` (the same rows on both devices).
CacheSetup fill_cache(KvDtype dt, int64_t slots, int64_t max_pos, int64_t hkv, int64_t D, Dist d,
                      uint64_t seed) {
  CacheSetup c;
  const int64_t rows = slots * max_pos, W = hkv * D;
  c.k_rows = host_tensor(make_values(rows, W, d, false, seed), rows, W, false);
  c.v_rows = host_tensor(make_values(rows, W, d, false, seed + 1), rows, W, false);
  std::vector<int64_t> s, p;
  for (int64_t r = 0; r < rows; ++r) s.push_back(r / max_pos), p.push_back(r % max_pos);
  c.cpu = ops::kv_cache_layer(slots, max_pos, hkv, D, dt);
  ops::kv_cache_write(c.cpu, c.k_rows, c.v_rows, index_tensor(s, true), index_tensor(p, true));
  c.gpu_layer = ops::kv_cache_layer(slots, max_pos, hkv, D, dt, gpu());
  ops::kv_cache_write(c.gpu_layer, to_gpu(c.k_rows), to_gpu(c.v_rows),
                      to_gpu(index_tensor(s, true)), to_gpu(index_tensor(p, true)));
  return c;
}

ops::KvCacheView view_of(ops::KvCacheLayer& L) {
  ops::KvCacheView v;
  v.k = L.k.raw(), v.v = L.v.raw();
  if (L.k_scale.defined()) v.k_scale = L.k_scale.ptr<float>(), v.v_scale = L.v_scale.ptr<float>();
  v.slots = L.slots(), v.max_pos = L.max_pos(), v.kv_heads = L.kv_heads(),
  v.head_dim = L.head_dim();
  v.dtype = L.dtype;
  return v;
}

void cached_cases() {
  struct Dims {
    int64_t hq, hkv, D;
  };
  std::vector<Dims> dims{{4, 4, 16}, {4, 2, 64},  {8, 1, 128},
                         {6, 3, 24}, {2, 1, 256}, {32, 4, 128}};
  const std::vector<int64_t> positions{0, 30, 31, 32, 33, 100, 64, 5};
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3})
    for (const Dims& dm : dims)
      for (int64_t rows : {int64_t(1), int64_t(7), int64_t(64)})
        for (Dist d : {Dist::kNormal, Dist::kEdge}) {
          if (d == Dist::kEdge && rows != 7) continue;
          const std::string name = std::string("attention_cached ") + kv_name(dt) + " " +
                                   std::to_string(dm.hq) + "/" + std::to_string(dm.hkv) + "x" +
                                   std::to_string(dm.D) + " rows " + std::to_string(rows) + " " +
                                   dist_name(d);
          run_case(name, [&] {
            const int64_t slots = 5, max_pos = 120;
            CacheSetup c = fill_cache(dt, slots, max_pos, dm.hkv, dm.D, d, case_seed(name));
            std::mt19937_64 g(case_seed(name) + 7);
            std::vector<int64_t> s, p;
            for (int64_t r = 0; r < rows; ++r)
              s.push_back(int64_t(g() % slots)),
                  p.push_back(positions[size_t(r) % positions.size()]);
            const Tensor q = host_tensor(make_values(rows, dm.hq * dm.D, d, false, g()), rows,
                                         dm.hq * dm.D, false);
            const ops::AttentionShape shape{dm.hq, dm.hkv, dm.D};
            Tensor lse_c;
            const Tensor out_c = ops::attention_cached(q, c.cpu, index_tensor(s, true),
                                                       index_tensor(p, false), shape, &lse_c);
            const Tensor qd = to_gpu(q), sd = to_gpu(index_tensor(s, true)),
                         pd = to_gpu(index_tensor(p, false));
            const int64_t rep = dm.hq / dm.hkv;
            std::vector<int> nhs{0, 1};
            for (int nh = 2; nh <= 8; nh *= 2)
              if (rep % nh == 0) nhs.push_back(nh);
            const ops::KvCacheView view = view_of(c.gpu_layer);
            std::string err;
            for (ac::CachedPath path :
                 {ac::CachedPath::kAuto, ac::CachedPath::kWarp, ac::CachedPath::kSplit})
              for (int nh : nhs) {
                const std::string tag = std::string(path == ac::CachedPath::kAuto   ? " [auto"
                                                    : path == ac::CachedPath::kWarp ? " [warp"
                                                                                    : " [split") +
                                        " nh " + std::to_string(nh) + "]";
                Tensor first;
                for (int run = 0; run < 2; ++run) {
                  set_poison_device_allocations(true);
                  Tensor out = Tensor::empty(DType::kF32, {rows, dm.hq * dm.D}, gpu());
                  Tensor lse = Tensor::empty(DType::kF32, {rows, dm.hq}, gpu());
                  set_poison_device_allocations(false);
                  ac::attention_cached(qd, view, sd, pd, dm.hq, float(ops::attention_scale(dm.D)),
                                       out, &lse, path, nh);
                  const std::string e =
                      compare_t(out_c, out, true, "out") + compare_t(lse_c, lse, true, "lse") +
                      (run == 0 ? std::string() : compare_t(first, out, false, "rerun out"));
                  if (!e.empty()) err += tag + e;
                  if (run == 0) first = out;
                }
                // The output stored as bf16 (a bf16 o_proj operand): the CPU output's cast.
                set_poison_device_allocations(true);
                Tensor ob = Tensor::empty(DType::kBF16, {rows, dm.hq * dm.D}, gpu());
                set_poison_device_allocations(false);
                ac::attention_cached(qd, view, sd, pd, dm.hq, float(ops::attention_scale(dm.D)), ob,
                                     nullptr, path, nh);
                const std::string eb = compare_t(cast(out_c, DType::kBF16), ob, true, "bf16 out");
                if (!eb.empty()) err += tag + eb;
              }
            // The entry (its own choice), without lse; F32 and BF16 outputs.
            err += compare_t(out_c, ops::attention_cached(qd, c.gpu_layer, sd, pd, shape), true,
                             "entry out");
            err += compare_t(
                cast(out_c, DType::kBF16),
                ops::attention_cached(qd, c.gpu_layer, sd, pd, shape, nullptr, DType::kBF16), true,
                "entry bf16 out");
            return err;
          });
        }
  // A 4097-key context (position 4096) beside short ones, every schedule.
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3}) {
    const std::string name = std::string("attention_cached ") + kv_name(dt) + " 32/4x128 long";
    if (g_opt.reduced) continue;
    run_case(name, [&] {
      CacheSetup c = fill_cache(dt, 2, 4100, 4, 128, Dist::kNormal, case_seed(name));
      const std::vector<int64_t> s{0, 1, 1}, p{4096, 0, 2047};
      const Tensor q = host_tensor(
          make_values(3, 32 * 128, Dist::kNormal, false, case_seed(name) + 9), 3, 32 * 128, false);
      Tensor lse_c;
      const Tensor out_c = ops::attention_cached(q, c.cpu, index_tensor(s, true),
                                                 index_tensor(p, true), {32, 4, 128}, &lse_c);
      const ops::KvCacheView view = view_of(c.gpu_layer);
      std::string err;
      for (ac::CachedPath path : {ac::CachedPath::kWarp, ac::CachedPath::kSplit})
        for (int nh : {1, 8}) {
          Tensor out = Tensor::empty(DType::kF32, {3, 32 * 128}, gpu());
          Tensor lse = Tensor::empty(DType::kF32, {3, 32}, gpu());
          ac::attention_cached(to_gpu(q), view, to_gpu(index_tensor(s, true)),
                               to_gpu(index_tensor(p, true)), 32, float(ops::attention_scale(128)),
                               out, &lse, path, nh);
          const std::string e =
              compare_t(out_c, out, true, "out") + compare_t(lse_c, lse, true, "lse");
          if (!e.empty())
            err += std::string(path == ac::CachedPath::kWarp ? " [warp" : " [split") + " nh " +
                   std::to_string(nh) + "]" + e;
        }
      return err;
    });
  }
  // Device indices out of range: NaN rows; the other rows as on the CPU.
  for (ac::CachedPath path : {ac::CachedPath::kWarp, ac::CachedPath::kSplit}) {
    const std::string name = std::string("attention_cached bad indices ") +
                             (path == ac::CachedPath::kWarp ? "warp" : "split");
    run_case(name, [&] {
      CacheSetup c = fill_cache(KvDtype::kBf16, 2, 40, 2, 64, Dist::kNormal, case_seed(name));
      const std::vector<int64_t> s{0, -1, 1, 2, 1}, p{3, 0, 40, 5, 39};
      const Tensor q = host_tensor(
          make_values(5, 4 * 64, Dist::kNormal, false, case_seed(name) + 3), 5, 256, false);
      Tensor out = Tensor::empty(DType::kF32, {5, 256}, gpu()),
             lse = Tensor::empty(DType::kF32, {5, 4}, gpu());
      ac::attention_cached(to_gpu(q), view_of(c.gpu_layer), to_gpu(index_tensor(s, true)),
                           to_gpu(index_tensor(p, true)), 4, float(ops::attention_scale(64)), out,
                           &lse, path, 0);
      const Tensor oh = out.to(Device::cpu()), lh = lse.to(Device::cpu());
      std::string err;
      for (int64_t r : {1, 2, 3}) {
        for (float x : std::span<const float>(oh.ptr<float>() + r * 256, 256))
          if (!std::isnan(x)) err = " row " + std::to_string(r) + " not NaN";
        for (float x : std::span<const float>(lh.ptr<float>() + r * 4, 4))
          if (!std::isnan(x)) err = " lse row " + std::to_string(r) + " not NaN";
      }
      for (int64_t r : {0, 4}) {
        Tensor lc;
        const Tensor oc = ops::attention_cached(
            q.slice_rows(r, r + 1).contiguous(), c.cpu, index_tensor({s[size_t(r)]}, true),
            index_tensor({p[size_t(r)]}, true), {4, 2, 64}, &lc);
        err += compare_t(oc, oh.slice_rows(r, r + 1).contiguous(), true, "valid row") +
               compare_t(lc, lh.slice_rows(r, r + 1).contiguous(), true, "valid lse");
      }
      return err;
    });
  }
  // The learner on the GPU: kv_round_inplace + kRowwise attention equals the cache, bit for bit.
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp8E4M3}) {
    const std::string name = std::string("attention_cached equals learner ") + kv_name(dt);
    run_case(name, [&] {
      const int64_t hq = 8, hkv = 2, D = 64, n = 77;
      const Tensor q = host_tensor(make_values(n, hq * D, Dist::kNormal, false, case_seed(name)), n,
                                   hq * D, false);
      const Tensor k = host_tensor(
          make_values(n, hkv * D, Dist::kNormal, false, case_seed(name) + 1), n, hkv * D, false);
      const Tensor v = host_tensor(
          make_values(n, hkv * D, Dist::kNormal, false, case_seed(name) + 2), n, hkv * D, false);
      Tensor kr = to_gpu(k), vr = to_gpu(v);
      ops::kv_round_inplace(kr, hkv, dt);
      ops::kv_round_inplace(vr, hkv, dt);
      const std::vector<int64_t> cu{0, n};
      Tensor lse_l;
      const Tensor out_l = ops::attention(to_gpu(q), kr, vr, index_tensor(cu, true), {hq, hkv, D},
                                          ops::AttentionKernel::kRowwise, &lse_l);
      ops::KvCacheLayer L = ops::kv_cache_layer(1, n, hkv, D, dt, gpu());
      std::vector<int64_t> s(static_cast<size_t>(n), 0), p(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
      ops::kv_cache_write(L, to_gpu(k), to_gpu(v), to_gpu(index_tensor(s, false)),
                          to_gpu(index_tensor(p, false)));
      Tensor lse_s;
      const Tensor out_s =
          ops::attention_cached(to_gpu(q), L, to_gpu(index_tensor(s, false)),
                                to_gpu(index_tensor(p, false)), {hq, hkv, D}, &lse_s);
      return compare_t(out_l, out_s, true, "out") + compare_t(lse_l, lse_s, true, "lse");
    });
  }
}

}  // namespace

void test_kv_cache() {
  if (want("kv_cache")) {
    round_cases();
    write_cases();
    prologue_cases();
  }
  if (want("attention_cached")) cached_cases();
}

}  // namespace lockstep::gpu_test
