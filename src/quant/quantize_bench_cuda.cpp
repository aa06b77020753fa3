// The CUDA quantizer benchmark: for one rows x cols bf16 input (>= 256 MB by default, far past
// the 50 MB L2), the median time of each quantizer, the bytes it must move (input read once plus
// every output written once) per second, and the ratio to a device-to-device copy of the same
// input measured in the same run. Compiles to nothing without LOCKSTEP_HAVE_CUDA.
#if defined(LOCKSTEP_HAVE_CUDA)
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "lockstep/quant/quantize_cuda.h"
#include "lockstep/tensor/cuda_timing.h"
#include "quantize_cuda_params.h"

namespace lockstep::cuda {
namespace {


double out_bytes(const DeviceQTensor& q) {
  return double(q.data.size() + q.block_scale.size() + q.amax.size() + q.scale_inv.size() + q.data_colwise.size() +
                q.block_scale_colwise.size());
}

}  // namespace

std::vector<BenchRow> bench_quantize_cuda(int64_t rows, int64_t cols, const std::string& filter, int iters) {
  const int64_t n = rows * cols;
  DeviceBuffer in(size_t(n) * 2), copy(size_t(n) * 2);
  detail::launch_fill_random_bf16(in.as<uint16_t>(), n, 42, nullptr);
  LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  const DeviceMatrix x{in.get(), InputType::kBF16, rows, cols, 3.3895313892515355e38f, "bench"};
  std::vector<BenchRow> out;
  const double in_bytes = double(n) * 2;

  BenchRow cp;
  cp.name = "device-to-device copy (baseline)";
  cp.us = median_time_us([&](int) { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(copy.get(), in.get(), size_t(n) * 2, cudaMemcpyDeviceToDevice)); }, iters);
  cp.bytes = 2 * in_bytes;
  cp.gbps = cp.bytes / cp.us * 1e-3;
  cp.ratio = 1.0;
  out.push_back(cp);

  auto add = [&](const std::string& name, double target, double extra_in, const std::function<void(DeviceQTensor&)>& f) {
    if (!filter.empty() && name.find(filter) == std::string::npos) return;
    DeviceQTensor q;
    f(q);
    LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());
    BenchRow r;
    r.name = name;
    r.target = target;
    r.us = median_time_us([&](int) { f(q); }, iters);
    r.bytes = in_bytes + extra_in + out_bytes(q);
    r.gbps = r.bytes / r.us * 1e-3;
    r.ratio = r.gbps / cp.gbps;
    out.push_back(r);
  };
  auto spec = [](Format f, Scaling s) {
    QuantConfig q;
    q.format = f, q.scaling = s;
    return q;
  };

  QuantConfig s = spec(Format::kNvfp4, Scaling::kPerRow);
  add("nvfp4 per_row (per-token)", 0.9, 0, [&](DeviceQTensor& q) { quantize_device(x, s, q); });
  QuantConfig sw = s;
  sw.scale_layout = ScaleLayout::kSwizzled;
  add("nvfp4 per_row swizzled scales", 0.9, 0, [&](DeviceQTensor& q) { quantize_device(x, sw, q); });
  QuantConfig st = spec(Format::kNvfp4, Scaling::kPerTensor);
  add("nvfp4 per_tensor (amax pass + quantize)", 0, 0, [&](DeviceQTensor& q) { quantize_device(x, st, q); });
  QuantConfig s2 = st;
  s2.block2d = true;
  add("nvfp4 2-D 16x16 per_tensor", 0.8, 0, [&](DeviceQTensor& q) { quantize_device(x, s2, q); });
  QuantConfig sr = s;
  sr.stochastic = true;
  add("nvfp4 per_row stochastic rounding", 0, 0, [&](DeviceQTensor& q) { quantize_device(x, sr, q); });
  QuantConfig mr = spec(Format::kMxfp8, Scaling::kBlock1x32);
  add("mxfp8 rowwise", 0.9, 0, [&](DeviceQTensor& q) { quantize_device(x, mr, q); });
  QuantConfig mrc = mr;
  mrc.colwise = true;
  add("mxfp8 rowwise+columnwise", 0.8, 0, [&](DeviceQTensor& q) { quantize_device(x, mrc, q); });
  QuantConfig f1 = spec(Format::kFp8, Scaling::kBlock1x128);
  add("fp8 1x128", 0.9, 0, [&](DeviceQTensor& q) { quantize_device(x, f1, q); });
  QuantConfig f2 = spec(Format::kFp8, Scaling::kBlock128x128);
  add("fp8 128x128 (amax pass + quantize)", 0, 0, [&](DeviceQTensor& q) { quantize_device(x, f2, q); });
  QuantConfig ft = spec(Format::kFp8, Scaling::kPerTensor);
  add("fp8 per_tensor (amax pass + quantize)", 0, 0, [&](DeviceQTensor& q) { quantize_device(x, ft, q); });
  QuantConfig fr = spec(Format::kFp8, Scaling::kPerRow);
  add("fp8 per_row", 0, 0, [&](DeviceQTensor& q) { quantize_device(x, fr, q); });

  // Grouped: 128 experts, ragged sizes (some empty), one launch.
  std::vector<int64_t> off{0};
  for (int g = 0; g < 128; ++g) {
    const int64_t share = (g % 7 == 3) ? 0 : rows / 112;
    off.push_back(g == 127 ? rows : std::min(rows, off.back() + share));
  }
  DeviceGroups groups(off);
  add("grouped nvfp4 per_row, 128 experts", 0.8, 0, [&](DeviceQTensor& q) { quantize_device(x, s, q, &groups); });
  QuantConfig sg = spec(Format::kNvfp4, Scaling::kPerGroup);
  add("grouped nvfp4 per_group, 128 experts (amax pass + quantize)", 0, 0, [&](DeviceQTensor& q) { quantize_device(x, sg, q, &groups); });

  // Fused MoE producers. Permute: rows/2 tokens, top-2, out = rows rows (every token twice).
  {
    const int64_t tokens = rows / 2;
    std::vector<int32_t> src(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) src[size_t(i)] = int32_t((i * 7919) % tokens);
    DeviceBuffer dsrc;
    dsrc.upload(std::span<const int32_t>(src));
    const DeviceMatrix xt{in.get(), InputType::kBF16, tokens, cols, x.type_max, "tokens"};
    DeviceGroups pg(off);
    add("fused permute + row amax + nvfp4 per_row", 0.8, double(rows) * 4,
        [&](DeviceQTensor& q) { permute_quantize_nvfp4_device(xt, dsrc.as<int32_t>(), rows, pg, s, q); });
    // The permuted rows are read once each: rows x cols bf16 = in_bytes (already counted).
  }
  {
    DeviceBuffer prob(size_t(rows) * 4);
    detail::launch_fill_f32(prob.as<float>(), rows, 0.375f, nullptr);
    add("fused weighted SwiGLU + row amax + nvfp4 per_row", 0.8, double(rows) * 4,
        [&](DeviceQTensor& q) { swiglu_quantize_nvfp4_device(x, prob.as<float>(), s, q); });
  }
  // Dequantize (bonus): NVFP4 per_row -> fp32.
  if (filter.empty() || std::string("dequantize nvfp4").find(filter) != std::string::npos) {
    DeviceQTensor q;
    quantize_device(x, s, q);
    DeviceBuffer o(size_t(n) * 4);
    BenchRow r;
    r.name = "dequantize nvfp4 per_row -> fp32";
    r.us = median_time_us([&](int) { dequantize_device(q, o.as<float>()); }, iters);
    r.bytes = out_bytes(q) + double(n) * 4;
    r.gbps = r.bytes / r.us * 1e-3;
    r.ratio = r.gbps / cp.gbps;
    out.push_back(r);
  }
  return out;
}

std::string format_bench_table(const std::vector<BenchRow>& rows) {
  std::string s = fmt::format("{:<60} {:>10} {:>10} {:>9} {:>8} {:>7}\n", "op", "us", "MB moved", "GB/s", "x copy", "target");
  for (const BenchRow& r : rows)
    s += fmt::format("{:<60} {:>10.1f} {:>10.1f} {:>9.1f} {:>8.3f} {:>7}\n", r.name, r.us, r.bytes / 1e6, r.gbps, r.ratio,
                     r.target > 0 ? fmt::format("{:.2f}{}", r.target, r.ratio >= r.target ? " ok" : " MISS") : "");
  return s;
}

}  // namespace lockstep::cuda
#endif  // LOCKSTEP_HAVE_CUDA
