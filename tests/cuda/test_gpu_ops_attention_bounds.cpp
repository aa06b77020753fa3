// The attention GPU tests' inputs and float64 error bounds (test_gpu_ops_attention.h; formulas in
// docs/ops.md, "Attention on the GPU"). Each bound sums, per output element, the worst case of
// every rounding the GPU path and the CPU reference make: bf16 operands (2^-8 relative), fp32 sums
// of N terms (3 N 2^-23 for both sides together), exp / ex2 (2^-20 absolute in the exponent), the
// online-softmax rescales, applied to the float64 sums of absolute values of the exact terms.
#include <algorithm>
#include <cmath>
#include <random>

#include "lockstep/numerics/hd.h"
#include "lockstep/ops/tensor_ops.h"
#include "test_gpu_ops_attention.h"

namespace lockstep::gpu_test::attention_test {

namespace {

constexpr double kU8 = 1.0 / 256;         // bf16 rounding, relative
constexpr double kF32 = 1.0 / 8388608.0;  // 2^-23
constexpr double kExp = 1.0 / 1048576.0;  // 2^-20: exp_f32 / ex2.approx, absolute in the exponent

float bf16(float x) { return num::bf16_to_f32(num::f32_to_bf16(x)); }

std::vector<double> dbl(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto s = c.data<float>();
  return {s.begin(), s.end()};
}

Tensor host(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return Tensor::from_vector<float>(v, {rows, cols}, DType::kF32);
}

std::vector<float> uniform(int64_t n, std::mt19937_64& g, bool round) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round ? bf16(u(g)) : u(g);
  return v;
}

// "|a - b| <= bound" over all elements; the first violation described.
std::string within(const std::vector<double>& a, const std::vector<double>& b,
                   const std::vector<double>& bound, const std::vector<char>& checked,
                   const char* what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!checked.empty() && !checked[i]) continue;
    const double e = std::fabs(a[i] - b[i]);
    if (!(e <= bound[i] + 1e-30) && bad++ == 0) first = i;
  }
  if (bad == 0) return "";
  char buf[256];
  std::snprintf(buf, sizeof(buf), " %s: %zu beyond bound, first @%zu: cpu %.9g gpu %.9g bound %.3g",
                what, bad, first, a[first], b[first], bound[first]);
  return buf;
}

}  // namespace

Packed::Packed(std::vector<int64_t> lens, int64_t hq_, int64_t hkv_, int64_t d)
    : lengths(std::move(lens)), cu{0}, hq(hq_), hkv(hkv_), D(d) {
  for (int64_t n : lengths) cu.push_back(cu.back() + n);
  T = cu.back();
}

std::string Packed::name() const {
  std::string s = std::to_string(hq) + "/" + std::to_string(hkv) + "x" + std::to_string(D) + " [";
  for (size_t i = 0; i < lengths.size(); ++i) s += (i ? "," : "") + std::to_string(lengths[i]);
  return s + "]";
}

Tensor Packed::cu_host() const {
  return Tensor::from_vector<int64_t>(cu, {int64_t(cu.size())}, DType::kI64);
}
Tensor Packed::cu_i32() const {
  std::vector<int32_t> c(cu.begin(), cu.end());
  return Tensor::from_vector<int32_t>(c, {int64_t(c.size())}, DType::kI32);
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBf16:
      return "bf16";
    case Kind::kUniform:
      return "uniform";
    case Kind::kPeaked:
      return "peaked";
    case Kind::kZeroQ:
      return "zero_q";
  }
  return "?";
}

Inputs raw_inputs(const Packed& p, Dist d, uint64_t seed) {
  Inputs in;
  in.q = host(make_values(p.T, p.hq * p.D, d, false, seed), p.T, p.hq * p.D);
  in.k = host(make_values(p.T, p.hkv * p.D, d, false, seed + 1), p.T, p.hkv * p.D);
  in.v = host(make_values(p.T, p.hkv * p.D, d, false, seed + 2), p.T, p.hkv * p.D);
  in.q_exact = in.kv_exact = false;
  return in;
}

Inputs bounded_inputs(const Packed& p, Kind kind, uint64_t seed) {
  std::mt19937_64 g(seed);
  const int64_t W = p.hkv * p.D, rep = p.hq / p.hkv;
  std::vector<float> k = uniform(p.T * W, g, true), v = uniform(p.T * W, g, true);
  std::vector<float> q = uniform(p.T * p.hq * p.D, g, kind != Kind::kUniform);
  if (kind == Kind::kZeroQ) std::fill(q.begin(), q.end(), 0.0f);
  if (kind == Kind::kPeaked)
    for (size_t s = 0; s + 1 < p.cu.size(); ++s)
      for (int64_t t = p.cu[s]; t < p.cu[s + 1]; ++t)
        for (int64_t h = 0; h < p.hq; ++h) {
          const int64_t j = p.cu[s] + int64_t(g() % uint64_t(t - p.cu[s] + 1)), kv = h / rep;
          for (int64_t d = 0; d < p.D; ++d)
            q[size_t((t * p.hq + h) * p.D + d)] = bf16(6.0f * k[size_t(j * W + kv * p.D + d)]);
        }
  Inputs in;
  in.q = host(q, p.T, p.hq * p.D);
  in.k = host(k, p.T, W);
  in.v = host(v, p.T, W);
  in.q_exact = kind != Kind::kUniform;
  return in;
}

std::string check_forward_bound(const Packed& p, const Inputs& in, const Tensor& out_cpu,
                                const Tensor& lse_cpu, const Tensor& out_gpu, const Tensor& lse_gpu,
                                int64_t row_step) {
  const std::vector<double> q = dbl(in.q), k = dbl(in.k), v = dbl(in.v);
  const int64_t D = p.D, W = p.hkv * D, rep = p.hq / p.hkv;
  const double scale = double(float(ops::attention_scale(D)));
  const double uop = (in.q_exact ? 0.0 : kU8) + (in.kv_exact ? 0.0 : kU8);
  std::vector<double> bo(size_t(p.T * p.hq * D), 0.0), bl(size_t(p.T * p.hq), 0.0);
  std::vector<char> co(bo.size(), 0), cl(bl.size(), 0);
  std::vector<double> x, w;
  for (size_t s = 0; s + 1 < p.cu.size(); ++s)
    for (int64_t t = p.cu[s]; t < p.cu[s + 1]; ++t)
      for (int64_t h = 0; h < p.hq; ++h) {
        if ((t * p.hq + h) % row_step != 0) continue;
        const int64_t n = t - p.cu[s] + 1, g = h / rep;
        const double* qi = q.data() + (t * p.hq + h) * D;
        x.assign(size_t(n), 0.0);
        double delta = 0, m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const double* kj = k.data() + ((p.cu[s] + j) * p.hkv + g) * D;
          double sd = 0, sa = 0;
          for (int64_t d = 0; d < D; ++d) sd += qi[d] * kj[d], sa += std::fabs(qi[d] * kj[d]);
          x[size_t(j)] = sd * scale;
          delta = std::max(
              delta, scale * sa * (uop + 3 * D * kF32) + 4 * kF32 * std::fabs(x[size_t(j)]) + kExp);
          m = std::max(m, x[size_t(j)]);
        }
        double sum = 0;
        w.assign(size_t(n), 0.0);
        for (int64_t j = 0; j < n; ++j) sum += (w[size_t(j)] = std::exp(x[size_t(j)] - m));
        const double lse = m + std::log(sum);
        // Rescales of both sides (a chunk of 32 keys on the CPU, a tile of 32 / 64 on the GPU),
        // each alpha within 2^-22 and its product rounded: 2^-21 per rescale.
        const double resc = double(n / 32 + n / 32 + 4) * kExp / 2;
        const double rel = std::expm1(2 * delta) + 2 * resc + kU8 + 3 * double(n) * kF32 + 4 * kF32;
        for (int64_t d = 0; d < D; ++d) {
          double Wd = 0;
          for (int64_t j = 0; j < n; ++j)
            Wd += w[size_t(j)] / sum * std::fabs(v[size_t(((p.cu[s] + j) * p.hkv + g) * D + d)]);
          bo[size_t((t * p.hq + h) * D + d)] = Wd * rel;
          co[size_t((t * p.hq + h) * D + d)] = 1;
        }
        bl[size_t(t * p.hq + h)] =
            delta + 2 * resc + 3 * double(n) * kF32 + 4 * kF32 * (1 + std::fabs(lse));
        cl[size_t(t * p.hq + h)] = 1;
      }
  (void)W;
  return within(dbl(out_cpu), dbl(out_gpu), bo, co, "out") +
         within(dbl(lse_cpu), dbl(lse_gpu), bl, cl, "lse");
}

std::string backward_case(const Packed& p, Kind kind, bool device_cu, uint64_t seed) {
  const Inputs in = bounded_inputs(p, kind, seed);
  std::mt19937_64 g(seed ^ 0x9E3779B97F4A7C15ull);
  const bool do_exact = kind != Kind::kUniform;
  const Tensor dout = host(uniform(p.T * p.hq * p.D, g, do_exact), p.T, p.hq * p.D);
  const ops::AttentionShape s{p.hq, p.hkv, p.D};
  Tensor lse;
  const Tensor out =
      ops::attention(in.q, in.k, in.v, p.cu_host(), s, ops::AttentionKernel::kRowwise, &lse);
  const ops::AttentionGrads gc =
      ops::attention_backward(in.q, in.k, in.v, out, lse, dout, p.cu_host(), s);
  const Tensor qd = to_gpu(in.q), kd = to_gpu(in.k), vd = to_gpu(in.v), od = to_gpu(out),
               ld = to_gpu(lse), dd = to_gpu(dout);
  const Tensor cu = device_cu ? to_gpu(p.cu_i32()) : p.cu_host();
  set_poison_device_allocations(true);
  const ops::AttentionGrads g1 = ops::attention_backward(qd, kd, vd, od, ld, dd, cu, s);
  const ops::AttentionGrads g2 = ops::attention_backward(qd, kd, vd, od, ld, dd, cu, s);
  set_poison_device_allocations(false);
  std::string err = compare_t(g1.dq, g2.dq, false, "rerun dq") +
                    compare_t(g1.dk, g2.dk, false, "rerun dk") +
                    compare_t(g1.dv, g2.dv, false, "rerun dv");
  // Bounds.
  const std::vector<double> q = dbl(in.q), k = dbl(in.k), v = dbl(in.v), o = dbl(out), l = dbl(lse),
                            dO = dbl(dout);
  const int64_t D = p.D, rep = p.hq / p.hkv;
  const double scale = double(float(ops::attention_scale(D)));
  const double uq = in.q_exact ? 0.0 : kU8, udo = do_exact ? 0.0 : kU8;
  std::vector<double> bq(q.size(), 0.0), bk(k.size(), 0.0), bv(v.size(), 0.0);
  std::vector<double> Di(size_t(p.T * p.hq)), Da(size_t(p.T * p.hq));
  for (int64_t r = 0; r < p.T * p.hq; ++r) {
    double a = 0, b = 0;
    for (int64_t d = 0; d < D; ++d) {
      a += dO[size_t(r * D + d)] * o[size_t(r * D + d)];
      b += std::fabs(dO[size_t(r * D + d)] * o[size_t(r * D + d)]);
    }
    Di[size_t(r)] = a, Da[size_t(r)] = b;
  }
  for (size_t sq = 0; sq + 1 < p.cu.size(); ++sq) {
    const int64_t s0 = p.cu[sq], n = p.cu[sq + 1] - s0;
    const double gkv = 3 * double(n * rep + 2) * kF32, gq = 3 * double(n + 2) * kF32;
    for (int64_t h = 0; h < p.hq; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t qr = (s0 + i) * p.hq + h;
        const double* qi = q.data() + qr * D;
        const double* di = dO.data() + qr * D;
        const double lse_i = l[size_t(qr)], D_i = Di[size_t(qr)];
        const double eD = Da[size_t(qr)] * 3 * D * kF32;
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t kr = (s0 + j) * p.hkv + h / rep;
          const double* kj = k.data() + kr * D;
          const double* vj = v.data() + kr * D;
          double sd = 0, sa = 0, pd = 0, pa = 0;
          for (int64_t d = 0; d < D; ++d) {
            sd += qi[d] * kj[d], sa += std::fabs(qi[d] * kj[d]);
            pd += di[d] * vj[d], pa += std::fabs(di[d] * vj[d]);
          }
          const double P = std::exp(sd * scale - lse_i);
          const double delta = scale * sa * (uq + 3 * D * kF32) +
                               4 * kF32 * (std::fabs(sd * scale) + std::fabs(lse_i)) + kExp;
          const double eP = P * (std::expm1(delta) + kU8 + kExp);
          const double edP = pa * (udo + 3 * D * kF32);
          const double dS = P * (pd - D_i);
          const double e1 = eP * (std::fabs(pd - D_i) + edP + eD) + P * (edP + eD);
          const double edS = e1 + kU8 * (std::fabs(dS) + e1);
          for (int64_t d = 0; d < D; ++d) {
            const double adO = std::fabs(di[d]), aq = std::fabs(qi[d]), ak = std::fabs(kj[d]);
            bv[size_t(kr * D + d)] += eP * adO * (1 + udo) + P * adO * (udo + gkv);
            bk[size_t(kr * D + d)] +=
                scale * (edS * aq * (1 + uq) + std::fabs(dS) * aq * (uq + gkv));
            bq[size_t(qr * D + d)] += scale * (edS * ak + std::fabs(dS) * ak * gq);
          }
        }
      }
  }
  err += within(dbl(gc.dq), dbl(g1.dq), bq, {}, "dq") +
         within(dbl(gc.dk), dbl(g1.dk), bk, {}, "dk") +
         within(dbl(gc.dv), dbl(g1.dv), bv, {}, "dv");
  return err;
}

}  // namespace lockstep::gpu_test::attention_test
