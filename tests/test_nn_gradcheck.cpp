// Float64 finite-difference gradient checks of the nn/ modules (Linear in the three backward
// modes, NormLinear, GroupedLinear with a zero-token expert, the MoE block with a shared expert),
// run through the real module code with the f32 pass-through format on F64 tensors.
//
// Tolerance: L = sum(G * y) is O(10); central differences with eps = 1e-6 have a truncation error
// of eps^2 / 6 |L'''| (~1e-11 here) and a rounding error of about n u |L| / (2 eps) with n ~ 100
// terms and u = 1.1e-16 (~1e-7 at most), so |fd - analytic| <= 1e-6 (1 + |analytic|) holds with
// margin while any wrong term (a missing factor, a transposed operand) is off by O(1e-2) or more.
#include <gtest/gtest.h>

#include <functional>

#include "lockstep/nn/grouped_linear.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/moe.h"
#include "test_util.h"
#include "tiny_model_util.h"

using namespace lockstep;
using namespace lockstep::test;

namespace {

constexpr double kEps = 1e-6;
constexpr double kTol = 1e-6;

Tensor rand64(std::vector<int64_t> shape, uint32_t stream, double scale = 1.0) {
  Tensor t(DType::kF64, std::move(shape));
  double* p = t.ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint32_t r = num::philox_element_word(test_seed(), stream, uint64_t(i));
    p[i] = scale * (double(r) / 4294967296.0 * 2.0 - 1.0);
  }
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.ptr<double>()[i] * b.ptr<double>()[i];
  return s;
}

// Checks elements of `param` (modified in place while probing) against `analytic`: every
// element, or an evenly spaced sample of about `max_probes` of them (offset by the test seed).
void check_fd(Tensor param, const Tensor& analytic, const std::function<double()>& loss,
              const std::string& what, int64_t max_probes = 1 << 30) {
  ASSERT_EQ(param.numel(), analytic.numel()) << what;
  double* p = param.ptr<double>();
  const int64_t step = std::max<int64_t>(1, param.numel() / max_probes);
  for (int64_t i = int64_t(test_seed() % uint64_t(step)); i < param.numel(); i += step) {
    const double keep = p[i];
    p[i] = keep + kEps;
    const double lp = loss();
    p[i] = keep - kEps;
    const double lm = loss();
    p[i] = keep;
    const double fd = (lp - lm) / (2 * kEps);
    const double an = analytic.ptr<double>()[i];
    ASSERT_NEAR(fd, an, kTol * (1 + std::fabs(an)))
        << what << " element " << i << " (seed " << test_seed() << ")";
  }
}

}  // namespace

TEST(NnGradcheck, LinearEveryBackwardMode) {
  for (BackwardMode mode :
       {BackwardMode::kQuantized, BackwardMode::kHighPrecision, BackwardMode::kDequantized}) {
    const int64_t T = 5, K = 32, N = 16;
    Tensor w = rand64({N, K}, 1, 0.3), g(DType::kF64, {N, K});
    Tensor x = rand64({T, K}, 2), G = rand64({T, N}, 3);
    nn::Linear lin("lin", w, g, f32_spec(mode));
    lin.forward(x, true);
    const Tensor dx = lin.backward(G);
    auto loss = [&] { return dot(lin.forward(x, false), G); };
    const std::string what = std::string(backward_mode_name(mode));
    check_fd(
        x, dx, [&] { return loss(); }, what + " dx");
    check_fd(
        w, g,
        [&] {
          lin.weights_changed();
          return loss();
        },
        what + " dW");
  }
}

TEST(NnGradcheck, NormLinear) {
  const int64_t T = 4, K = 32, N = 16;
  Tensor w = rand64({N, K}, 4, 0.3), g(DType::kF64, {N, K});
  Tensor nw = rand64({K}, 5, 0.5), ng(DType::kF64, {K});
  for (int64_t i = 0; i < K; ++i) nw.ptr<double>()[i] += 1.0;
  Tensor x = rand64({T, K}, 6), G = rand64({T, N}, 7);
  nn::NormLinear nl(nw, ng, 1e-6, nn::Linear("nl", w, g, f32_spec()));
  nl.forward(x, true);
  const Tensor dx = nl.backward(G);
  auto loss = [&] {
    nl.linear().weights_changed();
    return dot(nl.forward(x, false), G);
  };
  check_fd(x, dx, loss, "dx");
  check_fd(nw, ng, loss, "d norm weight");
  check_fd(w, g, loss, "dW");
}

TEST(NnGradcheck, GroupedLinearWithAnEmptyExpert) {
  const int64_t E = 3, N = 16, K = 32;
  const std::vector<int64_t> off{0, 3, 3, 7};  // expert 1 has no rows
  Tensor w = rand64({E * N, K}, 8, 0.3), g(DType::kF64, {E * N, K});
  Tensor x = rand64({7, K}, 9), G = rand64({7, N}, 10);
  nn::GroupedLinear gl("experts", w, g, E, f32_spec());
  gl.forward(x, i64_tensor(off), true);
  const Tensor dx = gl.backward(G);
  auto loss = [&] {
    gl.weights_changed();
    return dot(gl.forward(x, i64_tensor(off), false), G);
  };
  check_fd(x, dx, loss, "dx");
  check_fd(w, g, loss, "dW");
  for (int64_t i = N * K; i < 2 * N * K; ++i) ASSERT_EQ(g.ptr<double>()[i], 0.0) << "empty expert";
}

TEST(NnGradcheck, MoeBlockWithSharedExpert) {
  const int64_t T = 6, H = 32, E = 4, I = 16, Is = 16;
  std::vector<Tensor> ws{rand64({E, H}, 11, 0.5),     rand64({E * 2 * I, H}, 12, 0.3),
                         rand64({E * H, I}, 13, 0.3), rand64({2 * Is, H}, 14, 0.3),
                         rand64({H, Is}, 15, 0.3),    rand64({1, H}, 16, 0.3)};
  std::vector<Tensor> gs;
  for (const Tensor& w : ws) gs.emplace_back(DType::kF64, w.shape());
  const LinearSpec s = f32_spec();
  nn::MoeBlock moe(
      nn::Linear("router", ws[0], gs[0], s), nn::GroupedLinear("fc1", ws[1], gs[1], E, s),
      nn::GroupedLinear("fc2", ws[2], gs[2], E, s), nn::MoeOptions{2, true},
      nn::SharedExpert{nn::Linear("sgu", ws[3], gs[3], s), nn::Linear("sd", ws[4], gs[4], s),
                       nn::Linear("sg", ws[5], gs[5], s)});
  Tensor x = rand64({T, H}, 17), G = rand64({T, H}, 18);
  moe.forward(x, true);
  const Tensor dx = moe.backward(G);
  auto loss = [&] {
    moe.weights_changed();
    return dot(moe.forward(x, false), G);
  };
  check_fd(x, dx, loss, "dx", 64);
  const char* names[] = {"router", "fc1", "fc2", "shared gate_up", "shared down", "shared gate"};
  for (size_t i = 0; i < ws.size(); ++i) check_fd(ws[i], gs[i], loss, names[i], 64);
}

TEST(NnGradcheck, MoeBlockUnderRoutingReplay) {
  // Replayed experts (here the two least likely of each token, so never the router's own top-2):
  // the router is still differentiated through the gate weights p[e_s] / sum_s p[e_s], and the
  // loss is smooth in its weights (no selection can flip).
  const int64_t T = 6, H = 32, E = 4, I = 16;
  std::vector<Tensor> ws{rand64({E, H}, 21, 0.5), rand64({E * 2 * I, H}, 22, 0.3),
                         rand64({E * H, I}, 23, 0.3)};
  std::vector<Tensor> gs;
  for (const Tensor& w : ws) gs.emplace_back(DType::kF64, w.shape());
  const LinearSpec s = f32_spec();
  nn::MoeBlock moe(nn::Linear("router", ws[0], gs[0], s),
                   nn::GroupedLinear("fc1", ws[1], gs[1], E, s),
                   nn::GroupedLinear("fc2", ws[2], gs[2], E, s), nn::MoeOptions{2, true});
  Tensor x = rand64({T, H}, 24), G = rand64({T, H}, 25);
  nn::Linear probe("probe", ws[0], gs[0], s);
  const ops::RouterOut all = ops::router_topk(probe.forward(x, false), E, true);
  std::vector<int32_t> low;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = E - 2; j < E; ++j) low.push_back(all.expert_ids.ptr<int32_t>()[t * E + j]);
  const Tensor replay = Tensor::from_vector<int32_t>(low, {T, 2}, DType::kI32);
  Tensor used;
  moe.forward(x, true, replay, &used);
  ASSERT_EQ(std::vector<int32_t>(used.ptr<int32_t>(), used.ptr<int32_t>() + used.numel()), low);
  const Tensor dx = moe.backward(G);
  double router_grad = 0;
  for (int64_t i = 0; i < gs[0].numel(); ++i) router_grad += std::fabs(gs[0].ptr<double>()[i]);
  EXPECT_GT(router_grad, 0.0) << "the router gets no gradient under replay";
  auto loss = [&] {
    moe.weights_changed();
    return dot(moe.forward(x, false, replay), G);
  };
  check_fd(x, dx, loss, "dx", 64);
  const char* names[] = {"router", "fc1", "fc2"};
  for (size_t i = 0; i < ws.size(); ++i) check_fd(ws[i], gs[i], loss, names[i], 64);
}
