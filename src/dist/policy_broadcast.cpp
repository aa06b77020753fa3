// The weight-broadcast protocol (dist/policy_broadcast.h): a policy version encoded as a JSON
// header plus one byte payload, sent as preamble, header and payload buckets, decoded and checked
// on the receivers.
#include "lockstep/dist/policy_broadcast.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <optional>

#include "lockstep/model/policy_wire.h"
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

// The payload's bytes on the host, in layout order.
std::vector<std::byte> host_payload(const model::PolicyPayload& p) {
  std::vector<std::byte> out(p.payload_bytes);
  for (size_t i = 0; i < p.parts.size(); ++i)
    if (const size_t n = p.parts[i].nbytes())
      copy_bytes(out.data() + p.offsets[i], Device::cpu(), p.parts[i].raw(), p.parts[i].device(),
                 n);
  return out;
}

// The version a header and its received payload describe, on the host.
PolicyVersion decode_policy(const Json& j, std::span<const std::byte> payload) {
  model::PolicySkeleton s = model::policy_from_header(j, Device::cpu());
  if (s.payload.payload_bytes != payload.size())
    throw PolicyError(
        fmt::format("policy broadcast: version {}: the header describes {} payload "
                    "bytes, {} arrived",
                    s.policy.version, s.payload.payload_bytes, payload.size()));
  for (size_t i = 0; i < s.payload.parts.size(); ++i)
    if (const size_t n = s.payload.parts[i].nbytes())
      std::memcpy(s.payload.parts[i].raw(), payload.data() + s.payload.offsets[i], n);
  return std::move(s.policy);
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
  std::vector<std::byte> payload_out;
  std::string header;
  Preamble pre{};
  if (sender) {
    model::PolicyLayout layout = model::policy_layout(*p);
    payload_out = host_payload(layout.payload);
    Json& h = layout.header;
    h["bucket_fnv"] = Json::array();
    for (size_t off = 0; off < payload_out.size(); off += opt.bucket_bytes)
      h["bucket_fnv"].push_back(
          fnv1a64(std::span(payload_out)
                      .subspan(off, std::min(opt.bucket_bytes, payload_out.size() - off))));
    header = h.dump();
    pre = {header.size(), fnv1a64(std::as_bytes(std::span(header))), payload_out.size(),
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
  const size_t buckets = model::bucket_count(payload_bytes, bucket_bytes);
  if (stats) *stats = {header_bytes, payload_bytes, int64_t(buckets)};

  // 2. The header, then every bucket, always all of them.
  const Tensor header_in = send_bytes(comm, root, std::as_bytes(std::span(header)), header_bytes);
  std::vector<std::byte> payload(sender ? 0 : payload_bytes);
  std::vector<uint64_t> got(buckets);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t off = b * bucket_bytes, n = std::min(bucket_bytes, payload_bytes - off);
    const Tensor in = send_bytes(
        comm, root, sender ? std::span(payload_out).subspan(off, n) : std::span<std::byte>(), n);
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
