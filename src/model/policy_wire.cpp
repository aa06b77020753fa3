// A policy version as header + payload layout (model/policy_wire.h): the encoder lists every
// tensor with its payload range, the decoder allocates the same tensors on a device and checks
// that their ranges tile the payload in header order.
#include "lockstep/model/policy_wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace lockstep::model {
namespace {

// Lists tensors in payload order and describes each in the header.
struct LayoutWriter {
  PolicyPayload& out;
  Json entry(const Tensor& t) {
    if (!t.defined()) return nullptr;
    const Tensor c = t.contiguous();
    const size_t offset = out.payload_bytes;
    out.parts.push_back(c);
    out.offsets.push_back(offset);
    out.payload_bytes += c.nbytes();
    return Json{{"dtype", dtype_name(c.dtype())},
                {"shape", c.shape()},
                {"offset", offset},
                {"nbytes", c.nbytes()}};
  }
  Json qdata(const QData& d) {
    if (!d.defined()) return nullptr;
    return Json{{"scale_rows", d.scale_rows}, {"scale_cols", d.scale_cols},
                {"data", entry(d.data)},      {"block_scale", entry(d.block_scale)},
                {"amax", entry(d.amax)},      {"scale_inv", entry(d.scale_inv)}};
  }
};

// Allocates the tensors a header describes, in header order, each range checked to follow the
// previous one.
struct LayoutReader {
  PolicyPayload& out;
  Device device;
  int64_t version;
  DType dtype(const std::string& name) const {
    const std::optional<DType> d = dtype_from_name(name);
    if (!d)
      throw PolicyError(
          fmt::format("policy header: version {}: unknown dtype '{}'", version, name));
    return *d;
  }
  Tensor tensor(const Json& e) {
    if (e.is_null()) return {};
    const auto shape = e.at("shape").get<std::vector<int64_t>>();
    const DType dt = dtype(e.at("dtype").get<std::string>());
    const auto offset = e.at("offset").get<size_t>();
    const auto n = e.at("nbytes").get<size_t>();
    // The shape is checked before anything is allocated.
    size_t want = dtype_size(dt);
    for (const int64_t d : shape) {
      if (d < 0 || (d > 0 && want > (size_t(1) << 50) / size_t(d)))
        throw PolicyError(
            fmt::format("policy header: version {}: bad shape {}", version, shape_string(shape)));
      want *= size_t(d);
    }
    if (n != want || offset != out.payload_bytes)
      throw PolicyError(fmt::format(
          "policy header: version {}: tensor {} {} at payload bytes [{}, +{}) does not follow the "
          "previous one (expected [{}, +{}))",
          version, dtype_name(dt), shape_string(shape), offset, n, out.payload_bytes, want));
    Tensor t = Tensor::empty(dt, shape, device);
    out.parts.push_back(t);
    out.offsets.push_back(offset);
    out.payload_bytes += n;
    return t;
  }
  QData qdata(const Json& e) {
    QData d;
    if (e.is_null()) return d;
    d.scale_rows = e.at("scale_rows").get<int64_t>();
    d.scale_cols = e.at("scale_cols").get<int64_t>();
    d.data = tensor(e.at("data"));
    d.block_scale = tensor(e.at("block_scale"));
    d.amax = tensor(e.at("amax"));
    d.scale_inv = tensor(e.at("scale_inv"));
    return d;
  }
};

template <class E>
E enum_in_range(const Json& j, int count, const char* what, int64_t version) {
  const int v = j.get<int>();
  if (v < 0 || v >= count)
    throw PolicyError(
        fmt::format("policy header: version {}: {} {} is out of range", version, what, v));
  return E(v);
}

}  // namespace

PolicyLayout policy_layout(const PolicyVersion& p) {
  PolicyLayout out;
  LayoutWriter enc{out.payload};
  Json& j = out.header;
  j["version"] = p.version;
  j["checksum"] = p.checksum;
  j["checksum_version"] = kPolicyChecksumVersion;
  j["recipe"] = to_json(p.recipe);
  j["config"] = config_to_json(p.config);
  j["options"] = {{"force_bf16", p.options.force_bf16}, {"fuse_scales", p.options.fuse_scales}};
  Json dense = Json::object();
  for (const auto& [name, t] : p.dense) dense[name] = enc.entry(t);
  j["dense"] = std::move(dense);
  Json operands = Json::object();
  for (const auto& [key, o] : p.operands) {
    Json e{{"t", enc.entry(o.t)}, {"q", nullptr}};
    if (o.quantized()) {
      const QTensor& q = o.q;
      // Enumerators as their numbers; a receiver checks their range (and the transfers check
      // that both ends run the same build).
      e["q"] = {{"format", int(q.format)},
                {"scaling", int(q.scaling)},
                {"elem", int(q.elem)},
                {"block2d", q.block2d},
                {"hadamard", q.hadamard},
                {"scale_layout", int(q.scale_layout)},
                {"rows", q.rows},
                {"cols", q.cols},
                {"source_dtype", dtype_name(q.source_dtype)},
                {"group_offsets", q.group_offsets},
                {"rowwise", enc.qdata(q.rowwise)},
                {"colwise", enc.qdata(q.colwise)}};
    }
    operands[key] = std::move(e);
  }
  j["operands"] = std::move(operands);
  Json dims = Json::object();
  for (const auto& [key, d] : p.dims) dims[key] = {d.first, d.second};
  j["dims"] = std::move(dims);
  j["payload_bytes"] = out.payload.payload_bytes;
  return out;
}

PolicySkeleton policy_from_header(const Json& j, Device device) {
  PolicySkeleton s;
  PolicyVersion& p = s.policy;
  try {
    p.version = j.at("version").get<int64_t>();
    p.checksum = j.at("checksum").get<uint64_t>();
    if (const int cv = j.at("checksum_version").get<int>(); cv != kPolicyChecksumVersion)
      throw PolicyError(
          fmt::format("policy header: version {}: checksum definition {} (this build computes {})",
                      p.version, cv, kPolicyChecksumVersion));
    const std::string where = fmt::format("policy header version {}", p.version);
    p.recipe = recipe_from_json(j.at("recipe"), where);
    p.config = config_from_json(j.at("config"), where);
    p.options.force_bf16 = j.at("options").at("force_bf16").get<bool>();
    p.options.fuse_scales = j.at("options").at("fuse_scales").get<bool>();
    LayoutReader dec{s.payload, device, p.version};
    for (const auto& [name, e] : j.at("dense").items()) p.dense[name] = dec.tensor(e);
    for (const auto& [key, e] : j.at("operands").items()) {
      nn::Operand o;
      o.t = dec.tensor(e.at("t"));
      if (const Json& q = e.at("q"); !q.is_null()) {
        o.q.format =
            enum_in_range<Format>(q.at("format"), int(Format::kCount), "format", p.version);
        o.q.scaling =
            enum_in_range<Scaling>(q.at("scaling"), int(kScalingCount), "scaling", p.version);
        o.q.elem = enum_in_range<ElemCodec>(q.at("elem"), int(ElemCodec::kCount), "element codec",
                                            p.version);
        o.q.block2d = q.at("block2d").get<bool>();
        o.q.hadamard = q.at("hadamard").get<bool>();
        o.q.scale_layout =
            enum_in_range<ScaleLayout>(q.at("scale_layout"), 2, "scale layout", p.version);
        o.q.rows = q.at("rows").get<int64_t>();
        o.q.cols = q.at("cols").get<int64_t>();
        o.q.source_dtype = dec.dtype(q.at("source_dtype").get<std::string>());
        o.q.group_offsets = q.at("group_offsets").get<std::vector<int64_t>>();
        o.q.rowwise = dec.qdata(q.at("rowwise"));
        o.q.colwise = dec.qdata(q.at("colwise"));
      }
      p.operands[key] = std::move(o);
    }
    for (const auto& [key, d] : j.at("dims").items())
      p.dims[key] = {d.at(0).get<int64_t>(), d.at(1).get<int64_t>()};
    if (const auto n = j.at("payload_bytes").get<size_t>(); n != s.payload.payload_bytes)
      throw PolicyError(fmt::format(
          "policy header: version {}: the tensors fill {} payload bytes, the header says {}",
          p.version, s.payload.payload_bytes, n));
  } catch (const Json::exception& e) {
    throw PolicyError(fmt::format("policy header: malformed: {}", e.what()));
  }
  return s;
}

size_t bucket_count(size_t payload_bytes, size_t bucket_bytes) {
  if (bucket_bytes == 0) throw std::invalid_argument("bucket_count: bucket_bytes must be >= 1");
  return payload_bytes / bucket_bytes + (payload_bytes % bucket_bytes ? 1 : 0);
}

std::vector<BucketCopy> bucket_copies(const PolicyPayload& p, size_t bucket, size_t bucket_bytes) {
  if (bucket >= bucket_count(p.payload_bytes, bucket_bytes))
    throw std::invalid_argument(fmt::format(
        "bucket_copies: bucket {} of a {}-byte payload in {}-byte buckets does not exist", bucket,
        p.payload_bytes, bucket_bytes));
  const size_t lo = bucket * bucket_bytes, hi = std::min(p.payload_bytes, lo + bucket_bytes);
  std::vector<BucketCopy> out;
  for (size_t i = 0; i < p.parts.size(); ++i) {
    const size_t a = p.offsets[i], b = a + p.parts[i].nbytes();
    const size_t from = std::max(a, lo), to = std::min(b, hi);
    if (from >= to) continue;
    out.push_back({i, from - a, from - lo, to - from});
  }
  return out;
}

}  // namespace lockstep::model
