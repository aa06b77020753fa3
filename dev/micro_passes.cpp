// Lab: the time of each pass of the CUDA quantizers on one bf16 input (default 16384 x 8192),
// against a device copy of the same input in the same run: the domain amax pass, the column amax
// pass, the row kernels, the columnwise tile kernel in each mode and the MXFP8 tile kernel. Each
// pass is launched alone through the library's internal launchers (src/quant), so the numbers say
// where a whole quantizer's time goes. Before timing, every full quantizer configuration the passes
// serve is checked byte for byte against the CPU reference on a small input.
// Build: cmake -DLOCKSTEP_CUDA=ON -DLOCKSTEP_DEV=ON, target micro_passes. Run: micro_passes [rows
// cols]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_fill.h"
#include "cuda_timing.h"
#include "lockstep/quant/quantize.h"
#include "quant/quantize_cuda_params.h"

using namespace lockstep;
using namespace lockstep::cuda::detail;

namespace {

int check_bytes() {
  const Tensor x = bench::random_bf16(384, 640, 3, Device::cuda()).to(Device::cpu());
  const Tensor xd = x.to(Device::cuda());
  int bad = 0;
  auto same_part = [](const Tensor& p, const Tensor& q) {
    if (p.defined() != q.defined()) return false;
    if (!p.defined()) return true;
    const Tensor a = p.contiguous(), b = q.contiguous();
    return a.nbytes() == b.nbytes() &&
           std::equal(a.bytes().begin(), a.bytes().end(), b.bytes().begin());
  };
  auto one = [&](const char* name, QuantConfig c) {
    const QTensor a = quantize(x, c), b = quantize(xd, c).to(Device::cpu());
    bool same = true;
    for (Copy k : {Copy::kRowwise, Copy::kColwise}) {
      const QData &p = a.copy(k), &q = b.copy(k);
      same = same && same_part(p.data, q.data) && same_part(p.block_scale, q.block_scale) &&
             same_part(p.amax, q.amax) && same_part(p.scale_inv, q.scale_inv);
    }
    std::printf("  %-48s %s\n", name, same ? "bytes equal" : "MISMATCH");
    bad += same ? 0 : 1;
  };
  auto cfg = [](Format f, Scaling s, bool row, bool col) {
    QuantConfig c;
    c.format = f, c.scaling = s, c.rowwise = row, c.colwise = col;
    return c;
  };
  one("nvfp4 per_tensor row+col", cfg(Format::kNvfp4, Scaling::kPerTensor, true, true));
  one("nvfp4 per_row col", cfg(Format::kNvfp4, Scaling::kPerRow, false, true));
  one("fp8 1x128 row+col", cfg(Format::kFp8, Scaling::kBlock1x128, true, true));
  one("fp8 per_tensor row+col", cfg(Format::kFp8, Scaling::kPerTensor, true, true));
  one("fp8 per_row col", cfg(Format::kFp8, Scaling::kPerRow, false, true));
  one("mxfp8 row+col", cfg(Format::kMxfp8, Scaling::kBlock1x32, true, true));
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 2 ? std::atoll(argv[1]) : 16384,
                cols = argc > 2 ? std::atoll(argv[2]) : 8192;
  std::printf("byte checks against the CPU reference (384 x 640):\n");
  const int bad = check_bytes();
  const Device dev = Device::cuda();
  const Tensor x = bench::random_bf16(rows, cols, 42, dev);
  const int64_t n = rows * cols;
  Tensor copy = Tensor::empty(DType::kBF16, {rows, cols}, dev);
  Tensor codes = Tensor::empty(DType::kU8, {n}, dev), codes2 = Tensor::empty(DType::kU8, {n}, dev);
  Tensor scales = Tensor::empty(DType::kU8, {n / 16 + 1}, dev),
         scales2 = Tensor::empty(DType::kU8, {n / 16 + 1}, dev);
  Tensor f = Tensor::empty(DType::kF32, {2 * rows + 2 * cols + n / 128 + 16}, dev);
  Tensor keys = Tensor(DType::kU32, {cols + 16}, dev);
  const std::vector<int64_t> off_h = {0, rows};
  const Tensor off = Tensor::from_vector<int64_t>(off_h, {2}, DType::kI64).to(dev);
  std::vector<RowBand> bands_h;
  for (int64_t r = 0; r < rows; r += kColTileRows)
    bands_h.push_back(RowBand{r, int32_t(std::min<int64_t>(kColTileRows, rows - r)), 0});
  const auto* band_bytes = reinterpret_cast<const uint8_t*>(bands_h.data());
  const Tensor bands = Tensor::from_vector<uint8_t>(
                           std::span<const uint8_t>(band_bytes, bands_h.size() * sizeof(RowBand)),
                           {int64_t(bands_h.size() * sizeof(RowBand))}, DType::kU8)
                           .to(dev);
  synchronize(dev);
  const InputRef in{x.raw(), true, cols};
  const double in_bytes = double(n) * 2;
  const double copy_us = bench::median_time_us([&](int) { copy.copy_from(x); }, 20);
  const double copy_gbps = 2 * in_bytes / copy_us * 1e-3;
  std::printf("\n%lld x %lld bf16: device copy %.1f us (%.0f GB/s)\n", (long long)rows,
              (long long)cols, copy_us, copy_gbps);
  std::printf("%-52s %9s %9s %8s\n", "pass", "us", "MB", "x copy");
  auto time = [&](const char* name, double bytes, const std::function<void()>& fn) {
    const double us = bench::median_time_us([&](int) { fn(); }, 20);
    std::printf("%-52s %9.1f %9.1f %8.3f\n", name, us, bytes / 1e6, bytes / us * 1e-3 / copy_gbps);
  };
  float* fp = f.ptr<float>();
  time("domain amax, per tensor (read)", in_bytes, [&] {
    AmaxParams a;
    a.rows = rows, a.cols = cols, a.nchunks = int((cols + 15) / 16), a.keys = keys.ptr<uint32_t>();
    launch_domain_amax(in, a, nullptr);
  });
  time("column amax (read)", in_bytes, [&] {
    ColAmaxParams a;
    a.rows = rows, a.cols = cols, a.nchunks = int((cols + 15) / 16), a.offsets = off.ptr<int64_t>(),
    a.groups = 1;
    a.keys = keys.ptr<uint32_t>();
    launch_col_amax(in, a, nullptr);
  });
  time("nvfp4 per_row rows (read + write)", in_bytes + double(n) * (0.5 + 1.0 / 16), [&] {
    RowParams p;
    p.rows = rows, p.cols = cols, p.nchunks = int(cols / 16), p.amax_mode = kAmaxRow;
    p.data = codes.ptr<uint8_t>(), p.scale = scale_view(scales.ptr<uint8_t>(), cols / 16, false),
    p.amax_out = fp;
    launch_rows(in, RowFmt::kNvfp4, p, nullptr);
  });
  ColTileParams t;
  t.rows = rows, t.cols = cols, t.bands = reinterpret_cast<const RowBand*>(bands.raw()),
  t.offsets = off.ptr<int64_t>();
  t.tile_cols = (cols + 127) / 128, t.data_col = codes2.ptr<uint8_t>(),
  t.scale_col = scales2.ptr<uint8_t>();
  t.col_val = fp, t.dom_val = fp;
  launch_fill_f32(fp, 2 * rows + 2 * cols, 1.0f, nullptr);
  const int64_t nb = int64_t(bands_h.size());
  time("tile: nvfp4 columnwise (read + write)", in_bytes + double(n) * (0.5 + 1.0 / 16),
       [&] { launch_col_tiles(in, ColMode::kNvfp4, t, nb, nullptr); });
  ColTileParams tr = t;
  tr.data_row = codes.ptr<uint8_t>(),
  tr.scale_row = scale_view(scales.ptr<uint8_t>(), cols / 16, false);
  time("tile: nvfp4 rowwise + columnwise (read + 2 writes)",
       in_bytes + 2 * double(n) * (0.5 + 1.0 / 16),
       [&] { launch_col_tiles(in, ColMode::kNvfp4, tr, nb, nullptr); });
  ColTileParams tb = t;
  tb.data = codes.ptr<uint8_t>(), tb.scale_inv = fp + 2 * rows + 2 * cols,
  tb.scale_inv_col = fp + 2 * rows;
  const std::vector<int64_t> sb = {0, (rows + 127) / 128};
  const Tensor sbase = Tensor::from_vector<int64_t>(sb, {2}, DType::kI64).to(dev);
  tb.col_sbase = sbase.ptr<int64_t>();
  time("tile: fp8 1x128 rowwise + columnwise (read + 2 writes)", in_bytes + 2 * double(n),
       [&] { launch_col_tiles(in, ColMode::kFp8Block, tb, nb, nullptr); });
  time("tile: fp8 transpose (read + 2 writes)", in_bytes + 2 * double(n),
       [&] { launch_col_tiles(in, ColMode::kFp8Transpose, tb, nb, nullptr); });
  time("mxfp8 tile rowwise + columnwise (read + 2 writes)",
       in_bytes + 2 * double(n) * (1 + 1.0 / 32), [&] {
         MxTileParams p;
         p.rows = rows, p.cols = cols, p.data = codes.ptr<uint8_t>(),
         p.scale = scale_view(scales.ptr<uint8_t>(), cols / 32, false);
         p.data_col = codes2.ptr<uint8_t>(), p.scale_col = scales2.ptr<uint8_t>();
         launch_mxfp8_tile(in, p, nullptr);
       });
  synchronize(dev);
  return bad == 0 ? 0 : 1;
}
