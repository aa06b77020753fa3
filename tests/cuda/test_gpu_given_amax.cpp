// lockstep_test_gpu: quantize_with_amax (NVFP4 with the outer amax supplied by the caller, the
// converter's one-read path) on CUDA against the CPU, byte for byte: per_tensor and per_group
// (ragged groups, empty ones too), 1-D and 16x16 blocks, bf16 and f32 inputs, with each domain's
// true amax (also equal to plain quantize) and with a larger one (a joint quantization's).
#include <algorithm>
#include <cmath>

#include "lockstep/quant/given_amax.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {
namespace {

std::vector<float> domain_amax(const Tensor& x, const std::vector<int64_t>& bounds) {
  const std::vector<float> v = to_f32(x);
  const int64_t cols = x.cols();
  std::vector<float> a;
  for (size_t d = 0; d + 1 < bounds.size(); ++d) {
    float m = 0.0f;
    bool any = false, all_nan = true;
    for (int64_t i = bounds[d] * cols; i < bounds[d + 1] * cols; ++i) {
      any = true;
      if (std::isnan(v[size_t(i)])) continue;
      all_nan = false;
      m = std::max(m, std::fabs(v[size_t(i)]));
    }
    a.push_back(any && all_nan ? std::nanf("") : m);
  }
  return a;
}

}  // namespace

void test_given_amax() {
  if (!want("given_amax", "nvfp4")) return;
  for (Shape sh : std::vector<Shape>{{16, 16}, {993, 512}, {256, 2048}, {0, 32}})
    for (bool grouped : {false, true})
      for (bool b2 : {false, true})
        for (bool larger : {false, true})
          for (bool bf16 : {true, false}) {
            if (b2 && sh.rows % 16 != 0) continue;
            const std::string name =
                "given_amax nvfp4 " + std::string(grouped ? "per_group " : "per_tensor ") +
                std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + (b2 ? " 2d" : "") +
                (larger ? " larger" : "") + (bf16 ? " bf16" : " f32");
            if (!selected(name)) continue;
            QuantConfig c;
            c.format = Format::kNvfp4;
            c.block2d = b2;
            c.scaling = grouped ? Scaling::kPerGroup : Scaling::kPerTensor;
            const std::vector<int64_t> off =
                grouped ? ragged_offsets(5, std::max<int64_t>(sh.rows / 4, 0), b2 ? 16 : 1,
                                         case_seed(name))
                        : std::vector<int64_t>{};
            const int64_t rows = grouped ? off.back() : sh.rows;
            const Tensor x =
                host_tensor(make_values(rows, sh.cols, Dist::kNormal, bf16, case_seed(name)), rows,
                            sh.cols, bf16);
            std::vector<float> a = domain_amax(x, grouped ? off : std::vector<int64_t>{0, rows});
            if (larger)
              for (float& v : a) v = v * 2.0f + 1.0f;
            const Tensor ah = Tensor::from_vector<float>(a, {int64_t(a.size())}, DType::kF32);
            const Tensor xd = to_gpu(x), ad = to_gpu(ah);
            check_q(
                name, [&] { return quantize_with_amax(x, off, ah, c, "x"); },
                [&] { return quantize_with_amax(xd, off, ad, c, "x"); });
            if (!larger) {
              // The true amax gives quantize's own bytes on the device too.
              const std::string same =
                  compare_q(quantize_grouped(xd, off, c, "x").to(Device::cpu()),
                            quantize_with_amax(xd, off, ad, c, "x").to(Device::cpu()));
              report(name + " equals quantize", same);
            }
          }
}

}  // namespace lockstep::gpu_test
