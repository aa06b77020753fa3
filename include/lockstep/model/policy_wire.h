// A policy version (model/policy.h) as a JSON header plus one byte payload, the form every
// transfer of a version uses (the NCCL broadcast, CUDA IPC): the header holds the version,
// checksum, recipe, config, export options and every tensor's name, dtype, shape and byte range in
// the payload; the payload is every tensor's bytes in header order, never materialised here: a
// layout lists the tensors and their ranges, so a sender copies from the tensors where they live
// and a receiver allocates its tensors where it wants them and fills them range by range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "lockstep/model/policy.h"
#include "lockstep/recipe/json.h"

namespace lockstep::model {

// The payload's pieces in order: parts[i] (contiguous, on the policy's device) fills payload bytes
// [offsets[i], offsets[i] + parts[i].nbytes()); the ranges tile [0, payload_bytes) without gaps.
struct PolicyPayload {
  std::vector<Tensor> parts;
  std::vector<size_t> offsets;
  size_t payload_bytes = 0;
};

struct PolicyLayout {
  Json header;
  PolicyPayload payload;
};

// The header and payload layout of `p` (no tensor bytes are copied).
PolicyLayout policy_layout(const PolicyVersion& p);

// A version rebuilt from a header: every tensor allocated (uninitialised) on `device`, listed in
// payload order with its range, for the caller to fill. Throws PolicyError naming the problem for
// a header that is malformed, names an unknown dtype, or whose ranges do not tile the payload.
struct PolicySkeleton {
  PolicyVersion policy;
  PolicyPayload payload;
};
PolicySkeleton policy_from_header(const Json& header, Device device = Device::cpu());

// One copy of a bucketed transfer: payload bytes [bucket start + bucket_offset, + nbytes) are
// bytes [part_offset, + nbytes) of parts[part].
struct BucketCopy {
  size_t part = 0;
  size_t part_offset = 0;
  size_t bucket_offset = 0;
  size_t nbytes = 0;
};
// Bucket b covers payload bytes [b * bucket_bytes, min((b + 1) * bucket_bytes, payload_bytes)).
size_t bucket_count(size_t payload_bytes, size_t bucket_bytes);
// The copies that move bucket b between the payload's parts and one contiguous bucket buffer, in
// payload order (empty parts give none).
std::vector<BucketCopy> bucket_copies(const PolicyPayload& p, size_t bucket, size_t bucket_bytes);

}  // namespace lockstep::model
