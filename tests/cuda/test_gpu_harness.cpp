// lockstep_test_gpu harness (test_gpu.h): filters, seeds, reporting, inputs and comparisons.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "lockstep/numerics/hd.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {

Options g_opt;
int g_pass = 0, g_fail = 0, g_skip = 0;
const char* g_argv0 = "lockstep_test_gpu";

bool want(const std::string& op, const std::string& format) {
  bool op_ok = g_opt.op.empty();
  for (size_t b = 0; !op_ok && b <= g_opt.op.size();) {  // --op takes a comma-separated list
    const size_t e = std::min(g_opt.op.find(',', b), g_opt.op.size());
    op_ok = g_opt.op.compare(b, e - b, op) == 0 && e - b == op.size();
    b = e + 1;
  }
  return op_ok && (g_opt.format.empty() || format.empty() || g_opt.format == format);
}

namespace {
uint64_t name_hash(const std::string& name) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}
}  // namespace

bool selected(const std::string& name) {
  if (!g_opt.only.empty() && name.find(g_opt.only) == std::string::npos) return false;
  return g_opt.shards <= 1 || name_hash(name) % uint64_t(g_opt.shards) == uint64_t(g_opt.shard);
}

uint64_t case_seed(const std::string& name) { return g_opt.seed ^ name_hash(name); }

void report(const std::string& name, const std::string& err) {
  if (err.empty()) {
    ++g_pass;
    return;
  }
  ++g_fail;
  std::printf("FAIL %s:%s\n  repro: LOCKSTEP_TEST_SEED=%llu %s%s%s --only '%s'\n", name.c_str(),
              err.c_str(), (unsigned long long)g_opt.seed, g_argv0,
              g_opt.op.empty() ? "" : (" --op " + g_opt.op).c_str(),
              g_opt.kernel == GemmVariant::kAuto
                  ? ""
                  : (" --kernel " + std::string(gemm_variant_name(g_opt.kernel))).c_str(),
              name.c_str());
  std::fflush(stdout);
}

void skip(const std::string& name, const std::string& why) {
  ++g_skip;
  if (!g_opt.only.empty()) std::printf("skip %s: %s\n", name.c_str(), why.c_str());
}

const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kNormal:
      return "normal";
    case Dist::kEdge:
      return "edge";
    case Dist::kZeros:
      return "zeros";
    case Dist::kNanRows:
      return "nanrows";
  }
  return "?";
}

std::vector<float> make_values(int64_t rows, int64_t cols, Dist d, bool bf16, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::vector<float> v(size_t(rows * cols));
  const float kNan = std::bit_cast<float>(0x7FC00000u);
  const float specials[] = {0.0f,   -0.0f,    INFINITY, -INFINITY,   kNan,  1e38f,   -3.4e38f,
                            1e-40f, -1e-45f,  0.25f,    0.75f,       2.5f,  5.0f,    448.0f,
                            464.0f, 57344.0f, 6.0f,     1.0f / 6.0f, 1e-8f, 65504.0f};
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::pow(10.0f, -3.0f + 6.0f * ud(rng));
    const bool nan_row = d == Dist::kNanRows && (r % 3 == 1);
    for (int64_t c = 0; c < cols; ++c) {
      float x = nd(rng) * row_scale;
      if (d == Dist::kZeros) x = (r % 2 == 0) ? 0.0f : -0.0f;
      if (d == Dist::kEdge && ud(rng) < 0.08f)
        x = specials[rng() % (sizeof(specials) / sizeof(float))];
      if (d == Dist::kEdge && ud(rng) < 0.02f) x = std::ldexp(nd(rng), int(rng() % 250) - 140);
      if (nan_row) x = (c % 2) ? kNan : -kNan;
      if (bf16) x = num::bf16_to_f32(num::f32_to_bf16(x));
      v[size_t(r * cols + c)] = x;
    }
  }
  return v;
}

Tensor host_tensor(const std::vector<float>& v, int64_t rows, int64_t cols, bool bf16) {
  return from_f32(v, {rows, cols}, bf16 ? DType::kBF16 : DType::kF32);
}

Tensor to_gpu(const Tensor& t) { return t.defined() ? t.to(gpu()) : t; }

std::vector<int64_t> ragged_offsets(int64_t groups, int64_t max_rows, int64_t multiple,
                                    uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> off{0};
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = (rng() % 4 == 0) ? 0 : int64_t(rng() % uint64_t(max_rows + 1));  // empty
    off.push_back(off.back() + (n + multiple - 1) / multiple * multiple);
  }
  return off;
}

void run_case(const std::string& name, const std::function<std::string()>& body) {
  if (!selected(name)) return;
  std::string err;
  try {
    err = body();
  } catch (const std::exception& e) {
    set_poison_device_allocations(false);
    err = std::string(" threw: ") + e.what();
  }
  report(name, err);
}

namespace {

std::string shape_of(const Tensor& t) { return t.defined() ? t.describe() : std::string("none"); }

}  // namespace

std::string compare_t(const Tensor& expect, const Tensor& got, bool nan_equal, const char* what) {
  if (expect.defined() != got.defined())
    return std::string(" ") + what + ": " + shape_of(expect) + " vs " + shape_of(got);
  if (!expect.defined()) return "";
  if (expect.dtype() != got.dtype() || expect.shape() != got.shape())
    return std::string(" ") + what + ": " + expect.describe() + " vs " + got.describe();
  const Tensor a = expect.to(Device::cpu()).contiguous(), b = got.to(Device::cpu()).contiguous();
  const size_t es = dtype_size(a.dtype()), n = size_t(a.numel());
  const auto* pa = reinterpret_cast<const uint8_t*>(a.raw());
  const auto* pb = reinterpret_cast<const uint8_t*>(b.raw());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    bool same = std::memcmp(pa + i * es, pb + i * es, es) == 0;
    if (!same && nan_equal && (a.dtype() == DType::kF32 || a.dtype() == DType::kBF16)) {
      float x, y;
      if (es == 4)
        std::memcpy(&x, pa + i * es, 4), std::memcpy(&y, pb + i * es, 4);
      else {
        uint16_t hx, hy;
        std::memcpy(&hx, pa + i * es, 2), std::memcpy(&hy, pb + i * es, 2);
        x = num::bf16_to_f32(hx), y = num::bf16_to_f32(hy);
      }
      same = std::isnan(x) && std::isnan(y);
    }
    if (!same && bad++ == 0) first = i;
  }
  if (bad == 0) return "";
  return std::string(" ") + what + ":" + std::to_string(bad) + "@" + std::to_string(first);
}

std::string compare_q(const QTensor& e, const QTensor& g) {
  std::string err;
  auto meta = [&](const char* what, int64_t a, int64_t b) {
    if (a != b)
      err += std::string(" ") + what + "(" + std::to_string(a) + " vs " + std::to_string(b) + ")";
  };
  meta("format", int(e.format), int(g.format));
  meta("scaling", int(e.scaling), int(g.scaling));
  meta("elem", int(e.elem), int(g.elem));
  meta("block2d", e.block2d, g.block2d);
  meta("hadamard", e.hadamard, g.hadamard);
  meta("scale_layout", int(e.scale_layout), int(g.scale_layout));
  meta("rows", e.rows, g.rows);
  meta("cols", e.cols, g.cols);
  meta("source_dtype", int(e.source_dtype), int(g.source_dtype));
  if (e.group_offsets != g.group_offsets) err += " group_offsets";
  const char* names[2] = {"rowwise", "colwise"};
  const QData* ce[2] = {&e.rowwise, &e.colwise};
  const QData* cg[2] = {&g.rowwise, &g.colwise};
  for (int k = 0; k < 2; ++k) {
    const std::string p = names[k];
    meta((p + ".scale_rows").c_str(), ce[k]->scale_rows, cg[k]->scale_rows);
    meta((p + ".scale_cols").c_str(), ce[k]->scale_cols, cg[k]->scale_cols);
    err += compare_t(ce[k]->data, cg[k]->data, false, (p + ".data").c_str());
    err += compare_t(ce[k]->block_scale, cg[k]->block_scale, false, (p + ".block_scale").c_str());
    err += compare_t(ce[k]->amax, cg[k]->amax, false, (p + ".amax").c_str());
    err += compare_t(ce[k]->scale_inv, cg[k]->scale_inv, false, (p + ".scale_inv").c_str());
  }
  return err;
}

void check_q(const std::string& name, const std::function<QTensor()>& cpu,
             const std::function<QTensor()>& gpu_fn) {
  if (!selected(name)) return;
  QTensor expect;
  std::string cpu_err, gpu_err;
  try {
    expect = cpu();
  } catch (const std::invalid_argument& e) {
    cpu_err = e.what();
  }
  QTensor got[2];
  try {
    set_poison_device_allocations(true);
    for (int k = 0; k < 2; ++k) got[k] = gpu_fn().to(Device::cpu());
    set_poison_device_allocations(false);
  } catch (const std::invalid_argument& e) {
    set_poison_device_allocations(false);
    gpu_err = e.what();
  }
  if (!cpu_err.empty() || !gpu_err.empty()) {
    report(name, cpu_err.empty() == gpu_err.empty()
                     ? ""
                     : " cpu threw '" + cpu_err + "', cuda threw '" + gpu_err + "'");
    return;
  }
  std::string err = compare_q(expect, got[0]);
  const std::string again = compare_q(got[0], got[1]);
  if (!again.empty()) err += " | second run differs:" + again;
  report(name, err);
}

}  // namespace lockstep::gpu_test
