// Layout ops (ops/layout.h): every one a sequence of 2-D block copies (copy_2d) and zero fills on
// the tensor's device, so padding, cropping, splits and concatenations need no kernel of their own.
#include <fmt/format.h>

#include "entry_util.h"
#include "lockstep/ops/layout.h"

namespace lockstep::ops {

using namespace detail;

namespace {

// Copies the [rows, cols] block at the start of src (row stride src_cols elements) into dst (row
// stride dst_cols), both contiguous tensors of one device and dtype.
void copy_block(const Tensor& src, int64_t src_off, int64_t src_cols, Tensor& dst, int64_t dst_off,
                int64_t dst_cols, int64_t rows, int64_t cols) {
  const size_t es = dtype_size(src.dtype());
  copy_2d(static_cast<std::byte*>(dst.raw()) + size_t(dst_off) * es, size_t(dst_cols) * es,
          static_cast<const std::byte*>(src.raw()) + size_t(src_off) * es, size_t(src_cols) * es,
          size_t(cols) * es, size_t(rows), src.device());
}

void require_2d(const Tensor& x, const char* op) {
  check(x.defined() && x.dim() == 2, [&] {
    return fmt::format("{}: x {} must be 2-D", op, x.defined() ? x.describe() : "undefined");
  });
}

}  // namespace

Tensor pad2d(const Tensor& x_in, int64_t rows_to, int64_t cols_to) {
  require_2d(x_in, "pad2d");
  if (x_in.rows() == rows_to && x_in.cols() == cols_to) return x_in;
  check(rows_to >= x_in.rows() && cols_to >= x_in.cols(), [&] {
    return fmt::format("pad2d: x {} does not fit [{}, {}]", x_in.describe(), rows_to, cols_to);
  });
  const Tensor x = x_in.contiguous();
  Tensor y(x.dtype(), {rows_to, cols_to}, x.device());
  copy_block(x, 0, x.cols(), y, 0, cols_to, x.rows(), x.cols());
  return y;
}

Tensor crop2d(const Tensor& x_in, int64_t rows, int64_t cols) {
  require_2d(x_in, "crop2d");
  if (x_in.rows() == rows && x_in.cols() == cols) return x_in.contiguous();
  check(rows <= x_in.rows() && cols <= x_in.cols(), [&] {
    return fmt::format("crop2d: [{}, {}] is not inside x {}", rows, cols, x_in.describe());
  });
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.dtype(), {rows, cols}, x.device());
  copy_block(x, 0, x.cols(), y, 0, cols, rows, cols);
  return y;
}

Tensor pad_groups(const Tensor& w_in, int64_t groups, int64_t n_to, int64_t k_to) {
  require_2d(w_in, "pad_groups");
  check(groups >= 1 && w_in.rows() % groups == 0, [&] {
    return fmt::format("pad_groups: w {} is not {} equal groups", w_in.describe(), groups);
  });
  const int64_t n = w_in.rows() / groups, k = w_in.cols();
  if (n == n_to && k == k_to) return w_in;
  const Tensor w = w_in.contiguous();
  Tensor y(w.dtype(), {groups * n_to, k_to}, w.device());
  for (int64_t g = 0; g < groups; ++g) copy_block(w, g * n * k, k, y, g * n_to * k_to, k_to, n, k);
  return y;
}

Tensor crop_groups(const Tensor& w_in, int64_t groups, int64_t n, int64_t k) {
  require_2d(w_in, "crop_groups");
  check(groups >= 1 && w_in.rows() % groups == 0, [&] {
    return fmt::format("crop_groups: w {} is not {} equal groups", w_in.describe(), groups);
  });
  const int64_t n_to = w_in.rows() / groups, k_to = w_in.cols();
  if (n == n_to && k == k_to) return w_in.contiguous();
  const Tensor w = w_in.contiguous();
  Tensor y = Tensor::empty(w.dtype(), {groups * n, k}, w.device());
  for (int64_t g = 0; g < groups; ++g) copy_block(w, g * n_to * k_to, k_to, y, g * n * k, k, n, k);
  return y;
}

std::vector<Tensor> split_cols(const Tensor& x_in, std::initializer_list<int64_t> widths) {
  require_2d(x_in, "split_cols");
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  check(total == x_in.cols(), [&] {
    return fmt::format("split_cols: widths sum to {}, x {} has {} columns", total, x_in.describe(),
                       x_in.cols());
  });
  const Tensor x = x_in.contiguous();
  std::vector<Tensor> out;
  int64_t c0 = 0;
  for (int64_t w : widths) {
    Tensor t = Tensor::empty(x.dtype(), {x.rows(), w}, x.device());
    copy_block(x, c0, x.cols(), t, 0, w, x.rows(), w);
    out.push_back(std::move(t));
    c0 += w;
  }
  return out;
}

Tensor concat_cols(std::initializer_list<Tensor> parts) {
  check(parts.size() >= 1, "concat_cols: no parts");
  const Tensor& first = *parts.begin();
  int64_t C = 0;
  for (const Tensor& p : parts) {
    require_2d(p, "concat_cols");
    check(p.rows() == first.rows() && p.dtype() == first.dtype() && p.device() == first.device(),
          [&] {
            return fmt::format("concat_cols: part {} does not match {} (rows, dtype, device)",
                               p.describe(), first.describe());
          });
    C += p.cols();
  }
  Tensor out = Tensor::empty(first.dtype(), {first.rows(), C}, first.device());
  int64_t c0 = 0;
  for (const Tensor& p : parts) {
    const Tensor pc = p.contiguous();
    copy_block(pc, 0, pc.cols(), out, c0, C, pc.rows(), pc.cols());
    c0 += pc.cols();
  }
  return out;
}

}  // namespace lockstep::ops
