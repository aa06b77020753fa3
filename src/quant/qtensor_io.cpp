// Serialization of QTensor parts into safetensors tensors and metadata, and the checked inverse.
#include "lockstep/quant/qtensor_io.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>
#include <initializer_list>
#include <set>

#include "lockstep/quant/layout.h"
#include "quantize_meta.h"

namespace lockstep {
namespace {

constexpr const char* kParts[] = {".qdata",        ".block_scale",       ".amax",
                                  ".scale_inv",    ".qdata_colwise",     ".block_scale_colwise",
                                  ".amax_colwise", ".scale_inv_colwise", ".group_offsets"};

std::string meta_key(const std::string& name, const char* field) {
  return fmt::format("lockstep.{}.{}", name, field);
}

std::string elem_name(const QTensor& q) {
  if (q.format == Format::kNvfp4) return "e2m1";
  return q.elem == ElemCodec::kE5M2 ? "e5m2" : "e4m3";
}

DType elem_dtype(const QTensor& q) {
  return q.elem == ElemCodec::kE5M2 ? DType::kF8E5M2 : DType::kF8E4M3;
}

std::vector<int64_t> scale_shape(const QTensor& q, int64_t srows, int64_t scols) {
  if (q.scale_layout == ScaleLayout::kSwizzled) return {round_up(srows, 128), round_up(scols, 4)};
  return {srows, scols};
}

// The stored shape of an outer-statistic vector (amax / scale_inv) of a copy whose matrix has
// `mrows` rows and a scale grid [srows, scols].
std::vector<int64_t> outer_shape(const QTensor& q, int64_t n, int64_t srows, int64_t scols) {
  if (q.scaling == Scaling::kPerTensor) return {};
  if (q.scaling == Scaling::kBlock1x128 || q.scaling == Scaling::kBlock128x128)
    return {srows, scols};
  return {n};
}

// A host copy of `t` with a new dtype tag and shape (same bytes).
Tensor retag(const Tensor& t, DType dtype, std::vector<int64_t> shape) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  Tensor o(dtype, std::move(shape));
  if (o.nbytes() != h.nbytes())
    throw std::logic_error(fmt::format("qtensor part {} holds {} bytes, expected {}", h.describe(),
                                       h.nbytes(), o.nbytes()));
  if (o.nbytes()) std::memcpy(o.bytes().data(), h.bytes().data(), o.nbytes());
  return o;
}

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw SafetensorsError(fmt::format("quantized tensor '{}': {}", name, what));
}

// Part NAME+suffix, checked for dtype and shape, retagged as `as` with shape `as_shape`.
Tensor part(const SafetensorsFile& f, const std::string& name, const char* suffix, DType dtype,
            const std::vector<int64_t>& shape, DType as, std::vector<int64_t> as_shape) {
  const Tensor* t = f.find(name + suffix);
  if (!t) fail(name, fmt::format("missing part {}{}", name, suffix));
  if (t->dtype() != dtype || t->shape() != shape)
    fail(name, fmt::format("part {}{} is {}, expected {} {}", name, suffix, t->describe(),
                           shape_string(shape), dtype_name(dtype)));
  return retag(*t, as, std::move(as_shape));
}

// One part of a quantized tensor in a file: NAME + suffix, its file dtype and shape, and the
// QTensor tensor holding its bytes (null when planning from metadata alone).
struct PartPlan {
  const char* suffix;
  DType dtype;
  std::vector<int64_t> shape;
  const Tensor* bytes;
};

// The parts of q in file order (CONTRACT.md sections 11 and 12), from its metadata and which
// copies it has: the same list for writing a QTensor and for planning a file before quantizing.
std::vector<PartPlan> plan_parts(const QTensor& q, bool row, bool col) {
  std::vector<PartPlan> p;
  const QData& r = q.rowwise;
  const QData& c = q.colwise;
  const int64_t rows = q.rows, cols = q.cols, domains = rowwise_domains(q);
  auto ceil128 = [](int64_t v) { return (v + 127) / 128; };
  switch (q.format) {
    case Format::kNvfp4:
      if (row) {
        p.push_back({".qdata", DType::kU8, {rows, cols / 2}, &r.data});
        p.push_back(
            {".block_scale", DType::kF8E4M3, scale_shape(q, rows, cols / 16), &r.block_scale});
        p.push_back({".amax", DType::kF32, outer_shape(q, domains, 0, 0), &r.amax});
      }
      if (col) {
        // 2-D blocks: the transposed rowwise copy (the rowwise domains); 1-D: X^T's own domains.
        const int64_t n = q.block2d ? domains : (q.scaling == Scaling::kPerRow ? cols : domains);
        p.push_back({".qdata_colwise", DType::kU8, {cols, rows / 2}, &c.data});
        p.push_back({".block_scale_colwise", DType::kF8E4M3, scale_shape(q, cols, rows / 16),
                     &c.block_scale});
        p.push_back({".amax_colwise", DType::kF32, outer_shape(q, n, 0, 0), &c.amax});
      }
      break;
    case Format::kMxfp8:
      if (row) {
        p.push_back({".qdata", elem_dtype(q), {rows, cols}, &r.data});
        p.push_back(
            {".block_scale", DType::kF8E8M0, scale_shape(q, rows, cols / 32), &r.block_scale});
      }
      if (col) {
        p.push_back({".qdata_colwise", elem_dtype(q), {rows, cols}, &c.data});
        p.push_back({".block_scale_colwise", DType::kF8E8M0, {rows / 32, cols}, &c.block_scale});
      }
      break;
    case Format::kFp8: {
      // The scale_inv grid of a [m, k] copy: blocks, or one per domain.
      auto grid = [&](int64_t m, int64_t k, int64_t n) -> std::vector<int64_t> {
        if (q.scaling == Scaling::kBlock1x128) return {m, ceil128(k)};
        if (q.scaling == Scaling::kBlock128x128) return {ceil128(m), ceil128(k)};
        return outer_shape(q, n, 0, 0);
      };
      if (row) {
        p.push_back({".qdata", elem_dtype(q), {rows, cols}, &r.data});
        p.push_back({".scale_inv", DType::kF32, grid(rows, cols, domains), &r.scale_inv});
      }
      if (col) {
        p.push_back({".qdata_colwise", elem_dtype(q), {cols, rows}, &c.data});
        p.push_back({".scale_inv_colwise", DType::kF32,
                     grid(cols, rows, q.scaling == Scaling::kPerRow ? cols : domains),
                     &c.scale_inv});
      }
      break;
    }
    default:
      break;
  }
  return p;
}

// The lockstep.NAME.* metadata of q with the copies `row` / `col` (and lockstep.contract).
void add_metadata(std::map<std::string, std::string>& md, const std::string& name, const QTensor& q,
                  DType source, bool row, bool col) {
  md["lockstep.contract"] = kContractVersion;
  md[meta_key(name, "format")] = std::string(format_name(q.format));
  md[meta_key(name, "scaling")] = std::string(scaling_name(q.scaling));
  md[meta_key(name, "block2d")] = q.block2d ? "true" : "false";
  md[meta_key(name, "elem")] = elem_name(q);
  md[meta_key(name, "shape")] = fmt::format("{},{}", q.rows, q.cols);
  md[meta_key(name, "dtype")] = std::string(dtype_name(source));
  md[meta_key(name, "scale_layout")] =
      q.scale_layout == ScaleLayout::kCompact ? "compact" : "swizzled";
  if (q.hadamard) md[meta_key(name, "hadamard")] = "true";
  if (col)
    md[meta_key(name, "colwise")] =
        q.format == Format::kMxfp8 ? "blocks_down_columns" : "transposed";
  if (q.format == Format::kMxfp8) md[meta_key(name, "rowwise")] = row ? "true" : "false";
}

void refuse_grouped_colwise(const QTensor& q, const std::string& name, bool col) {
  if (col && !q.group_offsets.empty() && q.format != Format::kMxfp8)
    throw SafetensorsError(
        fmt::format("quantized tensor '{}': the columnwise copy of a grouped buffer is not a file "
                    "format; write each group's QTensor (group_view)",
                    name));
}

}  // namespace

void add_qtensor(SafetensorsFile& file, const std::string& name, const QTensor& q_in,
                 DType source) {
  const QTensor q = q_in.to(Device::cpu());
  refuse_grouped_colwise(q, name, q.has_colwise());
  add_metadata(file.metadata, name, q, source, q.has_rowwise(), q.has_colwise());
  for (const PartPlan& p : plan_parts(q, q.has_rowwise(), q.has_colwise()))
    file.tensors.push_back({name + p.suffix, retag(*p.bytes, p.dtype, p.shape)});
  if (!q.group_offsets.empty())
    file.tensors.push_back({name + ".group_offsets",
                            Tensor::from_vector<int64_t>(
                                q.group_offsets, {int64_t(q.group_offsets.size())}, DType::kI64)});
}

void plan_qtensor(std::vector<TensorSpec>& specs, std::map<std::string, std::string>& metadata,
                  const std::string& name, int64_t rows, int64_t cols, DType source,
                  const QuantConfig& cfg) {
  const QTensor q = quantized_meta(cfg, rows, cols, {});
  add_metadata(metadata, name, q, source, cfg.rowwise, cfg.colwise);
  for (const PartPlan& p : plan_parts(q, cfg.rowwise, cfg.colwise))
    specs.push_back({name + p.suffix, p.dtype, p.shape});
}

void write_qtensor(SafetensorsStreamWriter& w, const std::string& name, const QTensor& q_in) {
  if (!q_in.group_offsets.empty())
    throw std::logic_error(
        fmt::format("write_qtensor '{}': grouped buffers are written with add_qtensor", name));
  const QTensor q = q_in.to(Device::cpu());
  for (const PartPlan& p : plan_parts(q, q.has_rowwise(), q.has_colwise())) {
    const Tensor t = p.bytes->contiguous();
    w.write(name + p.suffix, t.bytes());
  }
}

std::vector<std::string> quantized_tensor_names(const SafetensorsFile& file) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& [key, value] : file.metadata) {
    const std::string prefix = "lockstep.", suffix = ".format";
    if (key.size() > prefix.size() + suffix.size() && key.starts_with(prefix) &&
        key.ends_with(suffix)) {
      std::string name = key.substr(prefix.size(), key.size() - prefix.size() - suffix.size());
      if (seen.insert(name).second) names.push_back(name);
    }
  }
  return names;
}

bool is_qtensor_part(const SafetensorsFile& file, const std::string& tensor_name) {
  for (const char* suffix : kParts) {
    std::string s(suffix);
    if (tensor_name.size() > s.size() && tensor_name.ends_with(s)) {
      std::string base = tensor_name.substr(0, tensor_name.size() - s.size());
      if (file.metadata.count(meta_key(base, "format"))) return true;
    }
  }
  return false;
}

QTensor read_qtensor(const SafetensorsFile& file, const std::string& name, DType* source) {
  auto meta = [&](const char* field) -> std::string {
    auto it = file.metadata.find(meta_key(name, field));
    if (it == file.metadata.end())
      fail(name, fmt::format("metadata '{}' is missing", meta_key(name, field)));
    return it->second;
  };
  auto meta_or = [&](const char* field, const char* dflt) -> std::string {
    auto it = file.metadata.find(meta_key(name, field));
    return it == file.metadata.end() ? dflt : it->second;
  };
  // Every value is one of the exact strings add_metadata writes: a file that says anything else
  // was not written by this contract, and guessing would rebuild other values.
  auto one_of = [&](const char* field, const std::string& value,
                    std::initializer_list<const char*> allowed) {
    for (const char* a : allowed)
      if (value == a) return;
    std::string list;
    for (const char* a : allowed) list += fmt::format("{}'{}'", list.empty() ? "" : " or ", a);
    fail(name,
         fmt::format("metadata '{}' is '{}'; expected {}", meta_key(name, field), value, list));
  };
  const auto contract = file.metadata.find("lockstep.contract");
  if (contract == file.metadata.end())
    fail(name, "metadata 'lockstep.contract' is missing (files lockstep writes have it)");
  if (contract->second != kContractVersion)
    fail(name, fmt::format("metadata 'lockstep.contract' is '{}'; this build reads contract '{}'",
                           contract->second, kContractVersion));
  QTensor q;
  auto fmt_opt = format_from_name(meta("format"));
  if (!fmt_opt || !is_quantized(*fmt_opt))
    fail(name, fmt::format("unknown format '{}'", meta("format")));
  q.format = *fmt_opt;
  auto sc = scaling_from_name(meta("scaling"));
  if (!sc) fail(name, fmt::format("unknown scaling '{}'", meta("scaling")));
  q.scaling = *sc;
  one_of("block2d", meta("block2d"), {"true", "false"});
  q.block2d = meta("block2d") == "true";
  one_of("hadamard", meta_or("hadamard", "false"), {"true", "false"});
  q.hadamard = meta_or("hadamard", "false") == "true";
  const std::string elem = meta("elem");
  if (q.format == Format::kNvfp4)
    one_of("elem", elem, {"e2m1"});
  else
    one_of("elem", elem, {"e4m3", "e5m2"});
  q.elem = elem == "e5m2" ? ElemCodec::kE5M2 : ElemCodec::kE4M3;
  if (const std::string why = quant_spec_violation(quant_spec(q)); !why.empty()) fail(name, why);
  // "ROWS,COLS": decimal digits only.
  const std::string shape = meta("shape");
  const size_t comma = shape.find(',');
  auto dim = [&](std::string_view t) {
    int64_t v = -1;
    const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || t.find_first_not_of("0123456789") != std::string_view::npos ||
        ec != std::errc() || ptr != t.data() + t.size())
      fail(name, fmt::format("bad shape metadata '{}' (expected ROWS,COLS)", shape));
    return v;
  };
  if (comma == std::string::npos)
    fail(name, fmt::format("bad shape metadata '{}' (expected ROWS,COLS)", shape));
  q.rows = dim(std::string_view(shape).substr(0, comma));
  q.cols = dim(std::string_view(shape).substr(comma + 1));
  auto d = dtype_from_name(meta("dtype"));
  if (!d) fail(name, fmt::format("unknown source dtype '{}'", meta("dtype")));
  q.source_dtype = *d;
  if (source) *source = *d;
  one_of("scale_layout", meta_or("scale_layout", "compact"), {"compact", "swizzled"});
  q.scale_layout = meta_or("scale_layout", "compact") == "swizzled" ? ScaleLayout::kSwizzled
                                                                    : ScaleLayout::kCompact;
  if (const Tensor* g = file.find(name + ".group_offsets")) {
    if (g->dtype() != DType::kI64 || g->dim() != 1)
      fail(name, "group_offsets must be a 1-D I64 tensor");
    auto v = g->data<int64_t>();
    q.group_offsets.assign(v.begin(), v.end());
    int64_t prev = 0;
    if (q.group_offsets.size() < 2 || q.group_offsets.front() != 0 ||
        q.group_offsets.back() != q.rows)
      fail(name, "group_offsets must start at 0 and end at the row count");
    for (int64_t o : q.group_offsets) {
      if (o < prev) fail(name, "group_offsets decrease");
      prev = o;
    }
  }
  const std::string colwise = meta_or("colwise", "");
  const bool has_col = file.find(name + ".qdata_colwise") != nullptr;
  const bool has_row = file.find(name + ".qdata") != nullptr;
  if (has_col && !q.group_offsets.empty() && q.format != Format::kMxfp8)
    fail(name, "a columnwise copy of a grouped buffer is not a file format");
  if (has_col && colwise != (q.format == Format::kMxfp8 ? "blocks_down_columns" : "transposed") &&
      !(q.format == Format::kMxfp8 && colwise.empty()))
    fail(name, fmt::format("metadata '{}' is '{}' for a {} columnwise copy",
                           meta_key(name, "colwise"), colwise, format_name(q.format)));
  if (!has_row && !has_col) fail(name, "neither .qdata nor .qdata_colwise is present");
  auto outer_n = [&](int64_t mrows) -> int64_t {
    if (q.scaling == Scaling::kPerRow) return mrows;
    if (q.scaling == Scaling::kPerGroup) {
      if (q.group_offsets.empty()) fail(name, "per_group scaling without group_offsets");
      return int64_t(q.group_offsets.size()) - 1;
    }
    return 1;
  };
  auto ceil128 = [](int64_t v) { return (v + 127) / 128; };
  switch (q.format) {
    case Format::kNvfp4: {
      if (q.cols % 16 != 0) fail(name, "nvfp4 shape needs cols % 16 == 0");
      if (has_row) {
        QData& o = q.rowwise;
        o.scale_rows = q.rows, o.scale_cols = q.cols / 16;
        o.data = part(file, name, ".qdata", DType::kU8, {q.rows, q.cols / 2}, DType::kU8,
                      {q.rows, q.cols / 2});
        const auto ss = scale_shape(q, o.scale_rows, o.scale_cols);
        o.block_scale = part(
            file, name, ".block_scale", DType::kF8E4M3, ss, DType::kU8,
            q.scale_layout == ScaleLayout::kCompact ? ss : std::vector<int64_t>{ss[0] * ss[1]});
        const int64_t n = outer_n(q.rows);
        o.amax = part(file, name, ".amax", DType::kF32, outer_shape(q, n, 0, 0), DType::kF32, {n});
      }
      if (has_col) {
        if (q.rows % 16 != 0) fail(name, "nvfp4 columnwise needs rows % 16 == 0");
        QData& o = q.colwise;
        o.scale_rows = q.cols, o.scale_cols = q.rows / 16;
        o.data = part(file, name, ".qdata_colwise", DType::kU8, {q.cols, q.rows / 2}, DType::kU8,
                      {q.cols, q.rows / 2});
        const auto ss = scale_shape(q, o.scale_rows, o.scale_cols);
        o.block_scale = part(
            file, name, ".block_scale_colwise", DType::kF8E4M3, ss, DType::kU8,
            q.scale_layout == ScaleLayout::kCompact ? ss : std::vector<int64_t>{ss[0] * ss[1]});
        const int64_t n = q.block2d ? outer_n(q.rows) : outer_n(q.cols);
        o.amax = part(file, name, ".amax_colwise", DType::kF32, outer_shape(q, n, 0, 0),
                      DType::kF32, {n});
      }
      break;
    }
    case Format::kMxfp8: {
      const DType ed = elem_dtype(q);
      if (has_row) {
        if (q.cols % 32 != 0) fail(name, "mxfp8 shape needs cols % 32 == 0");
        QData& o = q.rowwise;
        o.scale_rows = q.rows, o.scale_cols = q.cols / 32;
        o.data = part(file, name, ".qdata", ed, {q.rows, q.cols}, DType::kU8, {q.rows, q.cols});
        const auto ss = scale_shape(q, o.scale_rows, o.scale_cols);
        o.block_scale = part(
            file, name, ".block_scale", DType::kF8E8M0, ss, DType::kU8,
            q.scale_layout == ScaleLayout::kCompact ? ss : std::vector<int64_t>{ss[0] * ss[1]});
      }
      if (has_col) {
        if (q.rows % 32 != 0) fail(name, "mxfp8 columnwise needs rows % 32 == 0");
        QData& o = q.colwise;
        o.scale_rows = q.rows / 32, o.scale_cols = q.cols;
        o.data =
            part(file, name, ".qdata_colwise", ed, {q.rows, q.cols}, DType::kU8, {q.rows, q.cols});
        o.block_scale = part(file, name, ".block_scale_colwise", DType::kF8E8M0,
                             {q.rows / 32, q.cols}, DType::kU8, {q.rows / 32, q.cols});
      }
      break;
    }
    case Format::kFp8: {
      const DType ed = elem_dtype(q);
      auto grid = [&](int64_t mrows, int64_t mcols, int64_t& sr, int64_t& scn) {
        if (q.scaling == Scaling::kBlock1x128)
          sr = mrows, scn = ceil128(mcols);
        else if (q.scaling == Scaling::kBlock128x128)
          sr = ceil128(mrows), scn = ceil128(mcols);
        else
          sr = outer_n(mrows), scn = 1;
      };
      if (has_row) {
        QData& o = q.rowwise;
        grid(q.rows, q.cols, o.scale_rows, o.scale_cols);
        o.data = part(file, name, ".qdata", ed, {q.rows, q.cols}, DType::kU8, {q.rows, q.cols});
        o.scale_inv = part(file, name, ".scale_inv", DType::kF32,
                           outer_shape(q, o.scale_rows, o.scale_rows, o.scale_cols), DType::kF32,
                           {o.scale_rows, o.scale_cols});
      }
      if (has_col) {
        QData& o = q.colwise;
        // per_tensor / 128x128 copies are the transposed rowwise copy; per_row and 1x128 ones are
        // the quantization of X^T [cols, rows].
        if (q.scaling == Scaling::kPerTensor)
          o.scale_rows = 1, o.scale_cols = 1;
        else
          grid(q.cols, q.rows, o.scale_rows, o.scale_cols);
        o.data =
            part(file, name, ".qdata_colwise", ed, {q.cols, q.rows}, DType::kU8, {q.cols, q.rows});
        o.scale_inv = part(file, name, ".scale_inv_colwise", DType::kF32,
                           outer_shape(q, o.scale_rows, o.scale_rows, o.scale_cols), DType::kF32,
                           {o.scale_rows, o.scale_cols});
      }
      break;
    }
    default:
      break;
  }
  return q;
}

}  // namespace lockstep
