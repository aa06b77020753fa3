// The weight-broadcast protocol: a policy version (model/policy.h), quantized once on the learner
// rank, sent to every other rank of a Communicator in buckets of bounded size, reassembled and
// checked on arrival. The wire format is a fixed 16-byte preamble (header length, FNV-1a 64 of the
// header), a JSON header (version, recipe, config, export options, checksum, every tensor's name,
// dtype, shape and place in the payload, the FNV-1a 64 of each bucket), then the payload: every
// tensor's bytes in header order, cut into buckets of at most bucket_bytes. A receiver always takes
// every bucket (so all ranks run the same collectives), then refuses with model::PolicyError a
// header or bucket whose bytes do not hash to what the sender wrote, a version other than the one
// it expects, another recipe, or a policy whose bytes do not verify against its checksum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "lockstep/dist/communicator.h"
#include "lockstep/model/policy.h"

namespace lockstep::dist {

struct PolicyBroadcastOptions {
  int root = 0;                            // the learner rank that sends
  size_t bucket_bytes = size_t(64) << 20;  // payload bytes per broadcast at most (>= 1)
};

struct PolicyBroadcastStats {
  size_t header_bytes = 0;
  size_t payload_bytes = 0;
  int64_t buckets = 0;
};

// Every rank calls it. On the root, `p` is the version to send (a null `p` there is an error) and
// is returned unchanged; on the others `p` is ignored and the received version is returned with
// host tensors. expected_version / expected_recipe: what a receiver accepts (an empty recipe
// accepts any). stats (optional): what went over the wire, on every rank.
model::PolicyVersion broadcast_policy(Communicator& comm, const model::PolicyVersion* p,
                                      int64_t expected_version, const std::string& expected_recipe,
                                      const PolicyBroadcastOptions& opt = {},
                                      PolicyBroadcastStats* stats = nullptr);

}  // namespace lockstep::dist
