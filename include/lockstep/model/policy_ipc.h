// Policy versions between processes of one machine through CUDA IPC (docs/model.md, "Sync"): a
// sender (the learner's process) stages the version's payload (model/policy_wire.h) bucket by
// bucket in a few device buffers it shares once with cudaIpcGetMemHandle; the receiver (a sampler
// process, on the same or another GPU of the machine) maps them with cudaIpcOpenMemHandle, copies
// each bucket device to device into the tensors of its own copy of the version, and verifies the
// checksum on its device. A Unix domain socket carries the handshake and one small message per
// bucket; no weight byte passes through host memory.
//
// Peak extra device memory: slots x bucket_bytes on the sender's GPU (the staging buffers, by
// default 2 x 64 MiB), nothing on the receiver's beyond the version it receives (it copies
// straight from the mapped buffers into its tensors). Host memory: the JSON header.
//
// Messages (frames: an 8-byte little-endian length, then that many bytes of JSON):
//   receiver -> sender  {"hello": kPolicyIpcProtocol, "build", "last_version", "recipe", "pid"}
//   sender -> receiver  {"offer": header (policy_wire.h), "bucket_bytes", "buckets",
//                        "slots": [{"mem": hex, "event": hex}, ...], "build"}
//                       or {"refused": reason}
//   receiver -> sender  {"accept": true} or {"refused": reason}
//   per bucket b:  sender -> {"bucket": b, "slot": s, "nbytes": n}  (after its copy into slot
//                  s and an interprocess event recorded behind it); receiver waits for the event,
//                  copies, then -> {"done": b}; the sender refills slot s only after that.
//   receiver -> sender  {"verified": true | false, "checksum": hex}
// Refusals (each a PolicyError naming it, on the side that refuses, and reported to the other):
// another protocol or build, a version not above the receiver's last one, another recipe than
// the receiver expects, another checksum definition, a checksum that does not verify, a sender
// serving a version below the last one it served (the same version may go to several receivers). No
// CUDA backend or no GPU: a runtime_error saying so, from the constructors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/model/policy.h"
#include "lockstep/recipe/json.h"

namespace lockstep::model {

inline constexpr const char* kPolicyIpcProtocol = "lockstep-policy-ipc/1";

struct PolicyIpcOptions {
  size_t bucket_bytes = size_t(64) << 20;  // bytes per staging buffer (>= 1)
  int slots = 2;                           // staging buffers, i.e. buckets in flight (>= 1)
};

// What one transfer moved.
struct PolicyIpcStats {
  int64_t version = -1;
  uint64_t checksum = 0;
  size_t header_bytes = 0;
  size_t payload_bytes = 0;
  int64_t buckets = 0;
  size_t staging_bytes = 0;  // slots x bucket_bytes: the sender's extra device memory
  double seconds = 0;        // from the hello to the verdict
  // The receiver's parts of `seconds` (0 on the sender): setup (connect, offer, mapping the
  // staging buffers, allocating the version's tensors), transfer (the first bucket's message to
  // the last bucket copied) and verify (the checksum where the bytes landed).
  double setup_seconds = 0, transfer_seconds = 0, verify_seconds = 0;
};

// The sender: listens on a Unix domain socket and serves one version per call of serve().
class PolicyIpcSender {
 public:
  // socket_path: created here (refused when something exists there; at most 107 bytes);
  // device: the CUDA device of the staging buffers (the policy's device, for device-to-device
  // copies).
  PolicyIpcSender(std::string socket_path, Device device, PolicyIpcOptions opt = {});
  ~PolicyIpcSender();  // closes the socket and removes its file
  PolicyIpcSender(const PolicyIpcSender&) = delete;
  PolicyIpcSender& operator=(const PolicyIpcSender&) = delete;
  // Waits for one receiver to connect and sends `p` to it (its tensors on any device; CUDA ones
  // are copied device to device). Refuses a version below the last one served (the same version
  // may go to several receivers); a receiver's refusal comes back as a PolicyError with its reason.
  PolicyIpcStats serve(const PolicyVersion& p);
  std::optional<int64_t> last_version() const;
  const std::string& socket_path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The receiver: connects, receives one version per call of receive() onto its CUDA device.
class PolicyIpcReceiver {
 public:
  // expected_recipe: the recipe name a version must carry (empty: any).
  explicit PolicyIpcReceiver(Device device, std::string expected_recipe = "");
  ~PolicyIpcReceiver();
  PolicyIpcReceiver(const PolicyIpcReceiver&) = delete;
  PolicyIpcReceiver& operator=(const PolicyIpcReceiver&) = delete;
  // Connects to the sender at socket_path and returns the version it offers, its tensors on this
  // receiver's device, its checksum verified there.
  PolicyVersion receive(const std::string& socket_path, PolicyIpcStats* stats = nullptr);
  std::optional<int64_t> last_version() const { return last_; }

 private:
  Device device_;
  std::string recipe_;
  std::optional<int64_t> last_;
};

// Protocol pieces (no GPU needed; the tests drive them over a socketpair).
// One frame: 8-byte little-endian length, then the JSON text. Throws PolicyError when the peer
// closed the connection, a length exceeds kPolicyIpcMaxFrame or the text is not JSON.
inline constexpr size_t kPolicyIpcMaxFrame = size_t(1) << 30;
void ipc_write_frame(int fd, const Json& message);
Json ipc_read_frame(int fd, const char* what);
// This binary's build identity (version and source revision): both ends must match, since the
// header carries enumerators as numbers.
std::string ipc_build_id();
// Why a receiver refuses a header (empty: it accepts): a checksum definition other than this
// build's, a version not above last_version, a recipe other than expected_recipe (when non-empty).
std::string ipc_refusal(const Json& header, std::optional<int64_t> last_version,
                        const std::string& expected_recipe);
// Bytes as lowercase hex and back (the IPC handles in the offer); from_hex throws PolicyError for
// text of another length or with a non-hex character.
std::string to_hex(const void* p, size_t n);
void from_hex(const std::string& text, void* out, size_t n, const char* what);

}  // namespace lockstep::model
