// The CUDA rows of `lockstep bench quantize`: for one rows x cols bf16 input (16384 x 8192 = 256 MB
// by default, far past the 50 MB L2), the median time of each quantizer through the public entry
// points (device tensors in, device QTensors out), the bytes it must move (input read once, every
// output part written once) per second, the ratio to a device-to-device copy of the same input
// measured in the same run, and for the two-read passes the ceiling (R + W) / (2R + W).
#if defined(LOCKSTEP_HAVE_CUDA)
#include <algorithm>
#include <functional>

#include "bench_fill.h"
#include "cuda_timing.h"
#include "lockstep/quant/moe_fused.h"
#include "lockstep/quant/quantize.h"
#include "quantize_bench.h"

namespace lockstep::bench {
namespace {

QuantConfig spec(Format f, Scaling s, bool rowwise = true, bool colwise = false) {
  QuantConfig q;
  q.format = f, q.scaling = s, q.rowwise = rowwise, q.colwise = colwise;
  return q;
}

}  // namespace

std::vector<QuantBenchRow> bench_quantize_cuda(int64_t rows, int64_t cols,
                                               const std::string& filter, int iters) {
  const Device dev = Device::cuda();
  const Tensor x = random_bf16(rows, cols, 42, dev);
  Tensor copy = Tensor::empty(DType::kBF16, {rows, cols}, dev);
  synchronize(dev);
  const double in_bytes = double(x.nbytes());
  std::vector<QuantBenchRow> out;

  QuantBenchRow cp;
  cp.name = "device-to-device copy (baseline)";
  cp.us = median_time_us([&](int) { copy.copy_from(x); }, iters);
  cp.bytes = 2 * in_bytes;
  cp.gbps = cp.bytes / cp.us * 1e-3;
  cp.ratio = 1.0;
  out.push_back(cp);

  // two_read: the pass must read the input twice (an amax over the tensor, a group or a column
  // before the first code); target: of ratio (one read) or of ratio / ceiling (two reads).
  auto add = [&](const std::string& name, double target, bool two_read, double extra_in,
                 const std::function<QTensor()>& f) {
    if (!filter.empty() && name.find(filter) == std::string::npos) return;
    const QTensor q = f();
    synchronize(dev);
    QuantBenchRow r;
    r.name = name;
    r.target = target;
    r.us = median_time_us([&](int) { (void)f(); }, iters);
    const double R = in_bytes + extra_in, W = qtensor_bytes(q);
    r.bytes = R + W;
    r.gbps = r.bytes / r.us * 1e-3;
    r.ratio = r.gbps / cp.gbps;
    if (two_read) r.ceiling = (R + W) / (2 * R + W);
    out.push_back(r);
  };
  auto plain = [&](QuantConfig s) { return [&x, s] { return quantize(x, s); }; };

  QuantConfig s = spec(Format::kNvfp4, Scaling::kPerRow);
  add("nvfp4 per_row (per-token)", 0.9, false, 0, plain(s));
  QuantConfig sw = s;
  sw.scale_layout = ScaleLayout::kSwizzled;
  add("nvfp4 per_row swizzled scales", 0.9, false, 0, plain(sw));
  add("nvfp4 per_tensor", 0, true, 0, plain(spec(Format::kNvfp4, Scaling::kPerTensor)));
  QuantConfig s2 = spec(Format::kNvfp4, Scaling::kPerTensor);
  s2.block2d = true;
  add("nvfp4 2-D 16x16 per_tensor", 0.9, true, 0, plain(s2));
  QuantConfig sr = s;
  sr.stochastic = true;
  add("nvfp4 per_row stochastic rounding", 0.8, false, 0, plain(sr));
  // columnwise copies (CONTRACT.md section 12)
  add("nvfp4 per_tensor columnwise", 0.9, true, 0,
      plain(spec(Format::kNvfp4, Scaling::kPerTensor, false, true)));
  add("nvfp4 per_tensor rowwise+columnwise", 0.9, true, 0,
      plain(spec(Format::kNvfp4, Scaling::kPerTensor, true, true)));
  add("nvfp4 per_row columnwise (A per column)", 0.9, true, 0,
      plain(spec(Format::kNvfp4, Scaling::kPerRow, false, true)));
  QuantConfig sh = spec(Format::kNvfp4, Scaling::kPerTensor, false, true);
  sh.hadamard = true;
  add("nvfp4 per_tensor columnwise, Hadamard (transform copy first)", 0, true, 0, plain(sh));
  QuantConfig s2c = s2;
  s2c.colwise = true;
  add("nvfp4 2-D 16x16 rowwise+columnwise (transpose)", 0.9, true, 0, plain(s2c));
  add("mxfp8 rowwise", 0.9, false, 0, plain(spec(Format::kMxfp8, Scaling::kBlock1x32)));
  add("mxfp8 columnwise", 0.8, false, 0,
      plain(spec(Format::kMxfp8, Scaling::kBlock1x32, false, true)));
  add("mxfp8 rowwise+columnwise", 0.8, false, 0,
      plain(spec(Format::kMxfp8, Scaling::kBlock1x32, true, true)));
  add("fp8 1x128", 0.9, false, 0, plain(spec(Format::kFp8, Scaling::kBlock1x128)));
  add("fp8 1x128 columnwise", 0.8, false, 0,
      plain(spec(Format::kFp8, Scaling::kBlock1x128, false, true)));
  add("fp8 1x128 rowwise+columnwise", 0.8, false, 0,
      plain(spec(Format::kFp8, Scaling::kBlock1x128, true, true)));
  add("fp8 128x128", 0, true, 0, plain(spec(Format::kFp8, Scaling::kBlock128x128)));
  add("fp8 128x128 rowwise+columnwise (transpose)", 0.9, true, 0,
      plain(spec(Format::kFp8, Scaling::kBlock128x128, true, true)));
  add("fp8 per_tensor", 0, true, 0, plain(spec(Format::kFp8, Scaling::kPerTensor)));
  add("fp8 per_tensor rowwise+columnwise (transpose)", 0.9, true, 0,
      plain(spec(Format::kFp8, Scaling::kPerTensor, true, true)));
  add("fp8 per_row", 0, false, 0, plain(spec(Format::kFp8, Scaling::kPerRow)));
  add("fp8 per_row columnwise (scale per column)", 0.9, true, 0,
      plain(spec(Format::kFp8, Scaling::kPerRow, false, true)));

  // Grouped: 128 experts, ragged sizes (some empty; every size a multiple of 16 when rows is), one
  // launch.
  std::vector<int64_t> off{0};
  for (int g = 0; g < 128; ++g) {
    const int64_t share = (g % 7 == 3) ? 0 : rows / 112 / 16 * 16;
    off.push_back(g == 127 ? rows : std::min(rows, off.back() + share));
  }
  auto grouped = [&](QuantConfig q) {
    return [&x, &off, q] { return quantize_grouped(x, off, q); };
  };
  add("grouped nvfp4 per_row, 128 experts", 0.8, false, 0, grouped(s));
  add("grouped nvfp4 per_group, 128 experts", 0, true, 0,
      grouped(spec(Format::kNvfp4, Scaling::kPerGroup)));
  add("grouped nvfp4 per_group rowwise+columnwise, 128 experts", 0.9, true, 0,
      grouped(spec(Format::kNvfp4, Scaling::kPerGroup, true, true)));
  add("grouped fp8 1x128 rowwise+columnwise, 128 experts", 0.8, false, 0,
      grouped(spec(Format::kFp8, Scaling::kBlock1x128, true, true)));

  // Fused MoE producers. Permute: rows/2 tokens, top-2, rows output rows (every token twice).
  {
    const int64_t tokens = rows / 2;
    std::vector<int32_t> src(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) src[size_t(i)] = int32_t((i * 7919) % tokens);
    const Tensor dsrc = Tensor::from_vector<int32_t>(src, {rows}, DType::kI32).to(dev);
    const Tensor xt = x.slice_rows(0, tokens);
    // The permuted rows are read once each: rows x cols bf16 = in_bytes (already counted).
    add("fused permute + row amax + nvfp4 per_row", 0.8, false, double(rows) * 4,
        [&] { return permute_quantize(xt, dsrc, off, s); });
  }
  {
    const Tensor prob =
        Tensor::from_vector<float>(std::vector<float>(size_t(rows), 0.375f), {rows}, DType::kF32)
            .to(dev);
    add("fused weighted SwiGLU + row amax + nvfp4 per_row", 0.8, false, double(rows) * 4,
        [&] { return swiglu_quantize(x, prob, s); });
  }
  // Dequantize: NVFP4 per_row -> fp32.
  if (filter.empty() || std::string("dequantize nvfp4").find(filter) != std::string::npos) {
    const QTensor q = quantize(x, s);
    QuantBenchRow r;
    r.name = "dequantize nvfp4 per_row -> fp32";
    r.us = median_time_us([&](int) { (void)dequantize(q); }, iters);
    r.bytes = qtensor_bytes(q) + double(rows * cols) * 4;
    r.gbps = r.bytes / r.us * 1e-3;
    r.ratio = r.gbps / cp.gbps;
    r.target = 0.8;
    out.push_back(r);
  }
  synchronize(dev);
  return out;
}

}  // namespace lockstep::bench
#endif  // LOCKSTEP_HAVE_CUDA
