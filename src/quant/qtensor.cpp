// QTensor helpers that only look at metadata and make views: device, copies between devices,
// description, domains and per-group views (qtensor.h).
#include "lockstep/quant/qtensor.h"

#include <fmt/format.h>

#include "lockstep/quant/quantize.h"
#include "lockstep/quant/scale_access.h"

namespace lockstep {
namespace {

QData data_to(const QData& d, Device device, Stream stream) {
  QData o = d;
  for (Tensor* t : {&o.data, &o.block_scale, &o.amax, &o.scale_inv})
    if (t->defined()) *t = t->to(device, stream);
  return o;
}

Tensor piece(const Tensor& t, int64_t begin, int64_t end, std::vector<int64_t> shape) {
  return t.view({t.numel()}).slice_rows(begin, end).view(std::move(shape));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Device QTensor::device() const {
  if (rowwise.defined()) return rowwise.data.device();
  if (colwise.defined()) return colwise.data.device();
  return Device::cpu();
}

QTensor QTensor::to(Device d, Stream stream) const {
  QTensor q = *this;
  q.rowwise = data_to(rowwise, d, stream);
  q.colwise = data_to(colwise, d, stream);
  return q;
}

std::string QTensor::describe() const {
  std::string s =
      fmt::format("[{}, {}] {} {}", rows, cols, format_name(format), scaling_name(scaling));
  if (block2d) s += " 2d";
  if (!has_rowwise())
    s += " colwise-only";
  else if (has_colwise())
    s += " +colwise";
  if (!device().is_cpu()) s += fmt::format(" {}", device().str());
  return s;
}

QuantSpec quant_spec(const QTensor& q) {
  QuantSpec s;
  s.format = q.format;
  s.scaling = q.scaling;
  s.elem = q.elem;
  s.block2d = q.block2d;
  s.hadamard = q.hadamard;
  return s;
}

int64_t rowwise_domains(const QTensor& q) {
  if (q.scaling == Scaling::kPerRow) return q.rows;
  if (q.scaling == Scaling::kPerGroup)
    return q.group_offsets.empty() ? 1 : int64_t(q.group_offsets.size()) - 1;
  return 1;
}

int64_t rowwise_domain_of(const QTensor& q, int64_t r) {
  const int64_t groups = q.group_offsets.empty() ? 0 : int64_t(q.group_offsets.size()) - 1;
  return rowwise_domain(q.scaling, q.group_offsets.data(), groups, r);
}

QTensor group_view(const QTensor& q, int64_t g) {
  const int64_t ng = int64_t(q.group_offsets.size()) - 1;
  if (q.group_offsets.empty() || g < 0 || g >= ng)
    throw QuantError(
        fmt::format("group_view: group {} of {} ({} groups)", g, q.describe(), ng < 0 ? 0 : ng));
  if (q.scale_layout != ScaleLayout::kCompact)
    throw QuantError(fmt::format("group_view of {}: needs compact block scales", q.describe()));
  const int64_t r0 = q.group_offsets[size_t(g)], r1 = q.group_offsets[size_t(g + 1)], rg = r1 - r0;
  const int64_t cols = q.cols;
  const bool fp4 = q.format == Format::kNvfp4;
  QTensor v = q;
  v.rows = rg;
  v.group_offsets.clear();
  if (q.scaling == Scaling::kPerGroup) v.scaling = Scaling::kPerTensor;
  if (q.has_rowwise()) {
    const QData& r = q.rowwise;
    QData o;
    o.data = r.data.slice_rows(r0, r1);
    o.scale_rows = rg;
    o.scale_cols = r.scale_cols;
    if (r.block_scale.defined()) o.block_scale = r.block_scale.slice_rows(r0, r1);
    auto outer = [&](const Tensor& t) -> Tensor {
      if (!t.defined()) return t;
      if (q.scaling == Scaling::kPerRow) return t.slice_rows(r0, r1);
      if (q.scaling == Scaling::kPerGroup) return t.slice_rows(g, g + 1);
      if (q.scaling == Scaling::kBlock1x128) return t.slice_rows(r0, r1);
      if (q.scaling == Scaling::kBlock128x128) {
        o.scale_rows = ceil_div(rg, 128);
        return t.slice_rows(r0 / 128, r0 / 128 + ceil_div(rg, 128));
      }
      return t;
    };
    o.amax = outer(r.amax);
    o.scale_inv = outer(r.scale_inv);
    if (q.format == Format::kFp8 &&
        (q.scaling == Scaling::kPerRow || q.scaling == Scaling::kPerGroup ||
         q.scaling == Scaling::kPerTensor))
      o.scale_rows = o.scale_inv.size(0);
    v.rowwise = o;
  }
  if (q.has_colwise()) {
    const QData& c = q.colwise;
    QData o;
    if (q.format == Format::kMxfp8) {
      o.data = c.data.slice_rows(r0, r1);
      o.block_scale = c.block_scale.slice_rows(r0 / 32, r1 / 32);
      o.scale_rows = rg / 32;
      o.scale_cols = cols;
    } else if (fp4) {
      o.data = piece(c.data, cols * r0 / 2, cols * r1 / 2, {cols, rg / 2});
      o.block_scale = piece(c.block_scale, cols * r0 / 16, cols * r1 / 16, {cols, rg / 16});
      o.scale_rows = cols;
      o.scale_cols = rg / 16;
      if (q.scaling == Scaling::kPerRow)
        o.amax = piece(c.amax, g * cols, (g + 1) * cols, {cols});
      else if (q.scaling == Scaling::kPerGroup)
        o.amax = piece(c.amax, g, g + 1, {1});
      else
        o.amax = c.amax;
    } else {
      o.data = piece(c.data, cols * r0, cols * r1, {cols, rg});
      switch (q.scaling) {
        case Scaling::kBlock1x128: {
          int64_t before = 0;
          for (int64_t h = 0; h < g; ++h)
            before += ceil_div(q.group_offsets[size_t(h + 1)] - q.group_offsets[size_t(h)], 128);
          o.scale_rows = cols, o.scale_cols = ceil_div(rg, 128);
          o.scale_inv = piece(c.scale_inv, cols * before, cols * (before + o.scale_cols),
                              {cols, o.scale_cols});
          break;
        }
        case Scaling::kPerRow:
          o.scale_rows = cols, o.scale_cols = 1;
          o.scale_inv = piece(c.scale_inv, g * cols, (g + 1) * cols, {cols, 1});
          break;
        case Scaling::kPerGroup:
          o.scale_rows = 1, o.scale_cols = 1;
          o.scale_inv = piece(c.scale_inv, g, g + 1, {1, 1});
          break;
        case Scaling::kBlock128x128: {
          const int64_t nbc = ceil_div(cols, 128);
          o.scale_rows = nbc, o.scale_cols = rg / 128;
          o.scale_inv = piece(c.scale_inv, nbc * (r0 / 128), nbc * (r1 / 128), {nbc, rg / 128});
          break;
        }
        default:
          o.scale_rows = 1, o.scale_cols = 1;
          o.scale_inv = c.scale_inv.view({1, 1});
          break;
      }
    }
    v.colwise = o;
  }
  return v;
}

}  // namespace lockstep
