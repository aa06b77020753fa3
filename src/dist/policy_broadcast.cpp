// The weight-broadcast protocol (dist/policy_broadcast.h): a policy version encoded as a JSON
// header plus one byte payload, sent as preamble, header and payload buckets, decoded and checked
// on the receivers.
#include "lockstep/dist/policy_broadcast.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <optional>

#include "lockstep/recipe/json.h"

namespace lockstep::dist {
namespace {

using model::PolicyError;
using model::PolicyVersion;

uint64_t fnv1a64(std::span<const std::byte> b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const std::byte c : b) h = (h ^ uint64_t(c)) * 0x100000001b3ull;
  return h;
}

// The preamble: header length, header hash, payload length, bucket size, and the hash of those
// four, as host-order uint64 (every rank runs the same binary on one host).
constexpr size_t kPreambleWords = 5;
using Preamble = std::array<uint64_t, kPreambleWords>;

std::span<const std::byte> first_words(const Preamble& p) {
  return std::as_bytes(std::span(p).first(kPreambleWords - 1));
}

// Appends tensors to one payload and describes each in the header.
struct PayloadWriter {
  std::vector<std::byte> payload;
  Json entry(const Tensor& t) {
    if (!t.defined()) return nullptr;
    const Tensor c = t.to(Device::cpu()).contiguous();
    const size_t offset = payload.size();
    const auto bytes = c.bytes();
    payload.insert(payload.end(), bytes.begin(), bytes.end());
    return Json{{"dtype", dtype_name(c.dtype())},
                {"shape", c.shape()},
                {"offset", offset},
                {"nbytes", bytes.size()}};
  }
  Json qdata(const QData& d) {
    if (!d.defined()) return nullptr;
    return Json{{"scale_rows", d.scale_rows}, {"scale_cols", d.scale_cols},
                {"data", entry(d.data)},      {"block_scale", entry(d.block_scale)},
                {"amax", entry(d.amax)},      {"scale_inv", entry(d.scale_inv)}};
  }
};

Json encode_header(const PolicyVersion& p, PayloadWriter& enc) {
  Json j;
  j["version"] = p.version;
  j["checksum"] = p.checksum;
  j["recipe"] = to_json(p.recipe);
  j["config"] = model::config_to_json(p.config);
  j["options"] = {{"force_bf16", p.options.force_bf16}, {"fuse_scales", p.options.fuse_scales}};
  Json dense = Json::object();
  for (const auto& [name, t] : p.dense) dense[name] = enc.entry(t);
  j["dense"] = std::move(dense);
  Json operands = Json::object();
  for (const auto& [key, o] : p.operands) {
    Json e{{"t", enc.entry(o.t)}, {"q", nullptr}};
    if (o.quantized()) {
      const QTensor& q = o.q;
      // Enumerators as their numbers: sender and receivers are the same build.
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
  return j;
}

// Reads tensors back out of a received payload; every range is checked against it.
struct PayloadReader {
  std::span<const std::byte> payload;
  int64_t version;
  DType dtype(const std::string& name) const {
    const std::optional<DType> d = dtype_from_name(name);
    if (!d)
      throw PolicyError(
          fmt::format("policy broadcast: version {}: unknown dtype '{}'", version, name));
    return *d;
  }
  Tensor tensor(const Json& e) const {
    if (e.is_null()) return {};
    Tensor t(dtype(e.at("dtype").get<std::string>()), e.at("shape").get<std::vector<int64_t>>());
    const auto offset = e.at("offset").get<size_t>();
    const auto n = e.at("nbytes").get<size_t>();
    if (n != t.nbytes() || offset > payload.size() || n > payload.size() - offset)
      throw PolicyError(fmt::format(
          "policy broadcast: version {}: tensor {} at bytes [{}, +{}) does not fit the {}-byte "
          "payload",
          version, t.describe(), offset, n, payload.size()));
    if (n) std::memcpy(t.raw(), payload.data() + offset, n);
    return t;
  }
  QData qdata(const Json& e) const {
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

PolicyVersion decode_policy(const Json& j, std::span<const std::byte> payload) {
  PolicyVersion p;
  p.version = j.at("version").get<int64_t>();
  p.checksum = j.at("checksum").get<uint64_t>();
  const std::string where = fmt::format("policy broadcast version {}", p.version);
  p.recipe = recipe_from_json(j.at("recipe"), where);
  p.config = model::config_from_json(j.at("config"), where);
  p.options.force_bf16 = j.at("options").at("force_bf16").get<bool>();
  p.options.fuse_scales = j.at("options").at("fuse_scales").get<bool>();
  const PayloadReader dec{payload, p.version};
  for (const auto& [name, e] : j.at("dense").items()) p.dense[name] = dec.tensor(e);
  for (const auto& [key, e] : j.at("operands").items()) {
    nn::Operand o;
    o.t = dec.tensor(e.at("t"));
    if (const Json& q = e.at("q"); !q.is_null()) {
      o.q.format = Format(q.at("format").get<int>());
      o.q.scaling = Scaling(q.at("scaling").get<int>());
      o.q.elem = ElemCodec(q.at("elem").get<int>());
      o.q.block2d = q.at("block2d").get<bool>();
      o.q.hadamard = q.at("hadamard").get<bool>();
      o.q.scale_layout = ScaleLayout(q.at("scale_layout").get<int>());
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
  return p;
}

// Broadcasts `bytes` (the root's, or room for them on the others) through a U8 tensor on the
// communicator's device and returns what arrived, on the host.
Tensor send_bytes(Communicator& comm, int root, std::span<const std::byte> bytes, size_t n) {
  Tensor host(DType::kU8, {int64_t(n)});
  if (comm.rank() == root && n) std::memcpy(host.raw(), bytes.data(), n);
  Tensor wire = host.to(comm.device());
  comm.broadcast(wire, root);
  return wire.to(Device::cpu());
}

size_t bucket_count(size_t payload, size_t bucket) { return (payload + bucket - 1) / bucket; }

}  // namespace

PolicyVersion broadcast_policy(Communicator& comm, const PolicyVersion* p, int64_t expected_version,
                               const std::string& expected_recipe,
                               const PolicyBroadcastOptions& opt, PolicyBroadcastStats* stats) {
  const int root = opt.root;
  const bool sender = comm.rank() == root;
  if (root < 0 || root >= comm.size())
    throw std::invalid_argument(
        fmt::format("broadcast_policy: root {} is not a rank of {}", root, comm.describe()));
  if (opt.bucket_bytes == 0)
    throw std::invalid_argument("broadcast_policy: bucket_bytes must be at least 1");
  if (sender && !p)
    throw std::invalid_argument("broadcast_policy: the root rank has no policy version to send");

  // 1. The preamble: sizes every receiver needs to take part in the next broadcasts.
  PayloadWriter enc;
  std::string header;
  Preamble pre{};
  if (sender) {
    Json h = encode_header(*p, enc);
    h["bucket_fnv"] = Json::array();
    for (size_t off = 0; off < enc.payload.size(); off += opt.bucket_bytes)
      h["bucket_fnv"].push_back(
          fnv1a64(std::span(enc.payload)
                      .subspan(off, std::min(opt.bucket_bytes, enc.payload.size() - off))));
    header = h.dump();
    pre = {header.size(), fnv1a64(std::as_bytes(std::span(header))), enc.payload.size(),
           opt.bucket_bytes, 0};
    pre[kPreambleWords - 1] = fnv1a64(first_words(pre));
  }
  const Tensor pre_in = send_bytes(comm, root, std::as_bytes(std::span(pre)), sizeof pre);
  std::memcpy(pre.data(), pre_in.raw(), sizeof pre);
  if (fnv1a64(first_words(pre)) != pre[kPreambleWords - 1] || pre[3] == 0)
    // The sizes of what follows are unknown: this rank cannot stay in step with the others.
    throw PolicyError(fmt::format(
        "policy broadcast: rank {} received a preamble that does not verify; the transfer cannot "
        "continue",
        comm.rank()));
  const size_t header_bytes = pre[0], payload_bytes = pre[2], bucket_bytes = pre[3];
  const size_t buckets = bucket_count(payload_bytes, bucket_bytes);
  if (stats) *stats = {header_bytes, payload_bytes, int64_t(buckets)};

  // 2. The header, then every bucket, always all of them.
  const Tensor header_in = send_bytes(comm, root, std::as_bytes(std::span(header)), header_bytes);
  std::vector<std::byte> payload(sender ? 0 : payload_bytes);
  std::vector<uint64_t> got(buckets);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t off = b * bucket_bytes, n = std::min(bucket_bytes, payload_bytes - off);
    const Tensor in = send_bytes(
        comm, root, sender ? std::span(enc.payload).subspan(off, n) : std::span<std::byte>(), n);
    if (sender) continue;
    std::memcpy(payload.data() + off, in.raw(), n);
    got[b] = fnv1a64(std::span(payload).subspan(off, n));
  }
  if (sender) return *p;

  // 3. Checks, bytes first: nothing below trusts a byte that did not arrive as it was sent.
  if (fnv1a64(header_in.bytes()) != pre[1])
    throw PolicyError(fmt::format(
        "policy broadcast: rank {}: the {}-byte header does not hash to what the sender wrote",
        comm.rank(), header_bytes));
  const Json h =
      parse_json(std::string_view(reinterpret_cast<const char*>(header_in.raw()), header_bytes));
  const int64_t version = h.at("version").get<int64_t>();
  const auto want = h.at("bucket_fnv").get<std::vector<uint64_t>>();
  if (want.size() != buckets)
    throw PolicyError(
        fmt::format("policy broadcast: version {}: the header lists {} bucket(s), "
                    "the preamble {}",
                    version, want.size(), buckets));
  for (size_t b = 0; b < buckets; ++b)
    if (got[b] != want[b])
      throw PolicyError(fmt::format(
          "policy broadcast: rank {}: version {} bucket {} of {} (payload bytes [{}, {})) arrived "
          "with FNV-1a 64 {:016x}, the sender's is {:016x}; version refused",
          comm.rank(), version, b, buckets, b * bucket_bytes,
          std::min(payload_bytes, (b + 1) * bucket_bytes), got[b], want[b]));
  if (version != expected_version)
    throw PolicyError(fmt::format("policy broadcast: rank {}: version {} refused (expected {})",
                                  comm.rank(), version, expected_version));
  PolicyVersion out = decode_policy(h, payload);
  if (!expected_recipe.empty() && out.recipe.name != expected_recipe)
    throw PolicyError(
        fmt::format("policy broadcast: rank {}: version {} has recipe '{}', expected "
                    "'{}'",
                    comm.rank(), version, out.recipe.name, expected_recipe));
  if (const uint64_t sum = model::policy_checksum(out); sum != out.checksum)
    throw PolicyError(fmt::format(
        "policy broadcast: rank {}: version {} checksum {:016x} does not verify (the received "
        "bytes hash to {:016x})",
        comm.rank(), version, out.checksum, sum));
  return out;
}

}  // namespace lockstep::dist
