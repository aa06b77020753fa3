// Policy versions between processes through CUDA IPC (model/policy_ipc.h): the socket framing and
// handshake checks (host only), then the sender's staging buffers and the receiver's mapped
// copies (CUDA builds; a build without CUDA refuses in the constructors).
#include "lockstep/model/policy_ipc.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "lockstep/model/policy_wire.h"
#include "lockstep/version.h"

#if defined(LOCKSTEP_HAVE_CUDA)
#include "../tensor/cuda_util.h"
#endif

namespace lockstep::model {
namespace ipc_detail {

// A file descriptor closed with its owner (outside the anonymous namespace: the sender's Impl holds
// one).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace ipc_detail
using ipc_detail::Fd;

namespace {

void write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw PolicyError(fmt::format("policy ipc: sending to the peer failed: {}",
                                    std::strerror(k < 0 ? errno : EPIPE)));
    b += k;
    n -= size_t(k);
  }
}

// False when the peer closed the connection before the first byte.
bool read_all(int fd, void* p, size_t n, const char* what) {
  auto* b = static_cast<char*>(p);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::recv(fd, b + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0)
      throw PolicyError(
          fmt::format("policy ipc: reading {} failed: {}", what, std::strerror(errno)));
    if (k == 0) {
      if (got == 0) return false;
      throw PolicyError(fmt::format(
          "policy ipc: the peer closed the connection in the middle of {} ({} of {} bytes)", what,
          got, n));
    }
    got += size_t(k);
  }
  return true;
}

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path)
    throw std::invalid_argument(fmt::format("policy ipc: socket path '{}' must have 1 to {} bytes",
                                            path, sizeof a.sun_path - 1));
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

[[maybe_unused]] Fd connect_unix(const std::string& path) {
  const sockaddr_un a = unix_address(path);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0)
    throw std::runtime_error(fmt::format("policy ipc: socket(): {}", std::strerror(errno)));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    throw PolicyError(
        fmt::format("policy ipc: no sender listening at '{}': {}", path, std::strerror(errno)));
  return fd;
}

[[maybe_unused]] std::string str_or(const Json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// The refusal a message carries, if it is one; throws it as a PolicyError.
[[maybe_unused]] void throw_if_refused(const Json& m, const std::string& who) {
  if (m.is_object() && m.contains("refused"))
    throw PolicyError(fmt::format("policy ipc: the {} refused: {}", who, str_or(m, "refused")));
}

}  // namespace

// ---- protocol pieces ---------------------------------------------------------------------------

void ipc_write_frame(int fd, const Json& message) {
  const std::string text = message.dump();
  unsigned char len[8];
  for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * k));
  write_all(fd, len, sizeof len);
  write_all(fd, text.data(), text.size());
}

Json ipc_read_frame(int fd, const char* what) {
  unsigned char len[8];
  if (!read_all(fd, len, sizeof len, what))
    throw PolicyError(fmt::format("policy ipc: the peer closed the connection before {}", what));
  uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= uint64_t(len[k]) << (8 * k);
  if (n > kPolicyIpcMaxFrame)
    throw PolicyError(
        fmt::format("policy ipc: {} announces {} bytes, more than the {} a frame may hold", what, n,
                    kPolicyIpcMaxFrame));
  std::string text(size_t(n), '\0');
  if (n > 0 && !read_all(fd, text.data(), text.size(), what))
    throw PolicyError(fmt::format("policy ipc: the peer closed the connection in {}", what));
  try {
    return parse_json(text);
  } catch (const Json::exception& e) {
    throw PolicyError(fmt::format("policy ipc: {} is not JSON: {}", what, e.what()));
  }
}

std::string ipc_build_id() {
  return fmt::format("lockstep {} ({})", LOCKSTEP_VERSION, lockstep_source_revision());
}

std::string ipc_refusal(const Json& header, std::optional<int64_t> last_version,
                        const std::string& expected_recipe) {
  try {
    const int64_t v = header.at("version").get<int64_t>();
    if (const int cv = header.at("checksum_version").get<int>(); cv != kPolicyChecksumVersion)
      return fmt::format("version {} carries checksum definition {}, this build computes {}", v, cv,
                         kPolicyChecksumVersion);
    if (last_version && v <= *last_version)
      return fmt::format(
          "version {} refused: versions only move forward (the receiver's last is {})", v,
          *last_version);
    const std::string recipe = header.at("recipe").at("name").get<std::string>();
    if (!expected_recipe.empty() && recipe != expected_recipe)
      return fmt::format("version {} has recipe '{}', the receiver expects '{}'", v, recipe,
                         expected_recipe);
  } catch (const Json::exception& e) {
    return fmt::format("malformed policy header: {}", e.what());
  }
  return {};
}

std::string to_hex(const void* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* b = static_cast<const unsigned char*>(p);
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[b[i] >> 4];
    s[2 * i + 1] = kDigits[b[i] & 15];
  }
  return s;
}

void from_hex(const std::string& text, void* out, size_t n, const char* what) {
  if (text.size() != 2 * n)
    throw PolicyError(
        fmt::format("policy ipc: {} has {} hex digits, expected {}", what, text.size(), 2 * n));
  auto nibble = [&](char c) -> unsigned {
    if (c >= '0' && c <= '9') return unsigned(c - '0');
    if (c >= 'a' && c <= 'f') return unsigned(c - 'a' + 10);
    throw PolicyError(fmt::format("policy ipc: {} holds '{}', not a lowercase hex digit", what, c));
  };
  auto* b = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i)
    b[i] = static_cast<unsigned char>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
}

// ---- sender ------------------------------------------------------------------------------------

struct PolicyIpcSender::Impl {
  std::string path;
  Device device;
  PolicyIpcOptions opt;
  Fd listener;
  std::optional<int64_t> last;
#if defined(LOCKSTEP_HAVE_CUDA)
  std::vector<void*> staging;  // cudaMalloc'd (pool memory cannot be shared through IPC)
  std::vector<cudaEvent_t> events;
  Json slots = Json::array();
  ~Impl() {
    for (void* p : staging) cudaFree(p);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
#endif
};

PolicyIpcSender::PolicyIpcSender(std::string socket_path, Device device, PolicyIpcOptions opt)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = std::move(socket_path);
  m.device = device;
  m.opt = opt;
  if (opt.bucket_bytes == 0 || opt.slots < 1)
    throw std::invalid_argument(
        fmt::format("policy ipc sender: bucket_bytes ({}) and slots ({}) must be at least 1",
                    opt.bucket_bytes, opt.slots));
#if !defined(LOCKSTEP_HAVE_CUDA)
  throw std::runtime_error(
      "policy ipc sender: this build has no CUDA backend (CUDA IPC needs -DLOCKSTEP_CUDA=ON and "
      "a GPU)");
#else
  if (!device.is_cuda())
    throw std::invalid_argument(fmt::format(
        "policy ipc sender: the staging device must be a CUDA device, not {}", device.str()));
  require_device(device);
  const sockaddr_un a = unix_address(m.path);
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(m.path, ec)))
    throw std::invalid_argument(fmt::format(
        "policy ipc sender: '{}' exists; remove it or choose another socket path", m.path));
  const cuda::DeviceGuard on(device);
  for (int s = 0; s < opt.slots; ++s) {
    void* p = nullptr;
    LOCKSTEP_CUDA_CHECK(cudaMalloc(&p, opt.bucket_bytes));
    m.staging.push_back(p);
    cudaEvent_t e;
    LOCKSTEP_CUDA_CHECK(
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess));
    m.events.push_back(e);
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    LOCKSTEP_CUDA_CHECK(cudaIpcGetMemHandle(&mh, p));
    LOCKSTEP_CUDA_CHECK(cudaIpcGetEventHandle(&eh, e));
    m.slots.push_back({{"mem", to_hex(&mh, sizeof mh)}, {"event", to_hex(&eh, sizeof eh)}});
  }
  m.listener = Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (m.listener.get() < 0)
    throw std::runtime_error(fmt::format("policy ipc sender: socket(): {}", std::strerror(errno)));
  if (::bind(m.listener.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    throw std::runtime_error(
        fmt::format("policy ipc sender: cannot bind '{}': {}", m.path, std::strerror(errno)));
  if (::listen(m.listener.get(), 4) != 0) {
    ::unlink(m.path.c_str());
    throw std::runtime_error(fmt::format("policy ipc sender: listen(): {}", std::strerror(errno)));
  }
#endif
}

PolicyIpcSender::~PolicyIpcSender() {
  if (impl_ && impl_->listener.get() >= 0) ::unlink(impl_->path.c_str());
}

std::optional<int64_t> PolicyIpcSender::last_version() const { return impl_->last; }
const std::string& PolicyIpcSender::socket_path() const { return impl_->path; }

PolicyIpcStats PolicyIpcSender::serve(const PolicyVersion& p) {
  Impl& m = *impl_;
  if (m.last && p.version < *m.last)
    throw PolicyError(fmt::format(
        "policy ipc sender: version {} refused: versions only move forward (the last served was "
        "{})",
        p.version, *m.last));
#if !defined(LOCKSTEP_HAVE_CUDA)
  throw std::logic_error("policy ipc sender: unreachable without CUDA");
#else
  const PolicyLayout layout = policy_layout(p);
  const size_t B = m.opt.bucket_bytes;
  const size_t buckets = bucket_count(layout.payload.payload_bytes, B);
  Fd conn(::accept4(m.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (conn.get() < 0)
    throw std::runtime_error(fmt::format("policy ipc sender: accept(): {}", std::strerror(errno)));
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = conn.get();
  const Json hello = ipc_read_frame(fd, "the receiver's hello");
  if (str_or(hello, "hello") != kPolicyIpcProtocol || str_or(hello, "build") != ipc_build_id()) {
    const std::string why = fmt::format(
        "the receiver speaks '{}' from '{}', this sender '{}' from '{}'", str_or(hello, "hello"),
        str_or(hello, "build"), kPolicyIpcProtocol, ipc_build_id());
    ipc_write_frame(fd, {{"refused", why}});
    throw PolicyError("policy ipc sender: " + why);
  }
  Json offer{{"offer", layout.header},
             {"bucket_bytes", B},
             {"buckets", buckets},
             {"slots", m.slots},
             {"build", ipc_build_id()}};
  const std::string header_text = layout.header.dump();
  ipc_write_frame(fd, offer);
  throw_if_refused(ipc_read_frame(fd, "the receiver's answer"), "receiver");

  const cuda::DeviceGuard on(m.device);
  const cudaStream_t stream = cuda::cu(Stream{});
  const size_t slots = m.staging.size();
  auto wait_done = [&](size_t b) {
    const Json d = ipc_read_frame(fd, "a bucket acknowledgement");
    throw_if_refused(d, "receiver");
    if (!d.contains("done") || d["done"] != b)
      throw PolicyError(
          fmt::format("policy ipc sender: expected the receiver's done for bucket "
                      "{}, got {}",
                      b, d.dump()));
  };
  for (size_t b = 0; b < buckets; ++b) {
    const size_t s = b % slots;
    if (b >= slots) wait_done(b - slots);  // the receiver has copied what the slot held
    size_t n = 0;
    for (const BucketCopy& c : bucket_copies(layout.payload, b, B)) {
      const auto* src = static_cast<const char*>(layout.payload.parts[c.part].raw());
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(m.staging[s]) + c.bucket_offset,
                                          src + c.part_offset, c.nbytes, cudaMemcpyDefault,
                                          stream));
      n += c.nbytes;
    }
    LOCKSTEP_CUDA_CHECK(cudaEventRecord(m.events[s], stream));
    ipc_write_frame(fd, {{"bucket", b}, {"slot", s}, {"nbytes", n}});
  }
  for (size_t b = buckets > slots ? buckets - slots : 0; b < buckets; ++b) wait_done(b);
  const Json verdict = ipc_read_frame(fd, "the receiver's verdict");
  throw_if_refused(verdict, "receiver");
  if (!verdict.value("verified", false))
    throw PolicyError(fmt::format(
        "policy ipc sender: the receiver could not verify version {} (checksum {:016x}; its "
        "bytes hash to {})",
        p.version, p.checksum, str_or(verdict, "checksum")));
  m.last = p.version;
  PolicyIpcStats st;
  st.version = p.version;
  st.checksum = p.checksum;
  st.header_bytes = header_text.size();
  st.payload_bytes = layout.payload.payload_bytes;
  st.buckets = int64_t(buckets);
  st.staging_bytes = slots * B;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
#endif
}

// ---- receiver ----------------------------------------------------------------------------------

PolicyIpcReceiver::PolicyIpcReceiver(Device device, std::string expected_recipe)
    : device_(device), recipe_(std::move(expected_recipe)) {
#if !defined(LOCKSTEP_HAVE_CUDA)
  throw std::runtime_error(
      "policy ipc receiver: this build has no CUDA backend (CUDA IPC needs -DLOCKSTEP_CUDA=ON and "
      "a GPU)");
#else
  if (!device.is_cuda())
    throw std::invalid_argument(fmt::format(
        "policy ipc receiver: the version must land on a CUDA device, not {}", device.str()));
  require_device(device);
#endif
}

PolicyIpcReceiver::~PolicyIpcReceiver() = default;

#if defined(LOCKSTEP_HAVE_CUDA)
namespace {

// The sender's staging buffers and events, mapped into this process for one transfer.
struct MappedSlots {
  std::vector<void*> mem;
  std::vector<cudaEvent_t> events;
  ~MappedSlots() {
    for (void* p : mem) cudaIpcCloseMemHandle(p);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};

}  // namespace
#endif

PolicyVersion PolicyIpcReceiver::receive(const std::string& socket_path, PolicyIpcStats* stats) {
#if !defined(LOCKSTEP_HAVE_CUDA)
  (void)socket_path;
  (void)stats;
  throw std::logic_error("policy ipc receiver: unreachable without CUDA");
#else
  const auto t0 = std::chrono::steady_clock::now();
  const Fd conn = connect_unix(socket_path);
  const int fd = conn.get();
  ipc_write_frame(fd, {{"hello", kPolicyIpcProtocol},
                       {"build", ipc_build_id()},
                       {"last_version", last_ ? Json(*last_) : Json(nullptr)},
                       {"recipe", recipe_},
                       {"pid", int64_t(::getpid())}});
  const Json offer = ipc_read_frame(fd, "the sender's offer");
  throw_if_refused(offer, "sender");
  if (str_or(offer, "build") != ipc_build_id() || !offer.contains("offer")) {
    const std::string why = fmt::format("the sender runs '{}', this receiver '{}'",
                                        str_or(offer, "build"), ipc_build_id());
    ipc_write_frame(fd, {{"refused", why}});
    throw PolicyError("policy ipc receiver: " + why);
  }
  const Json& header = offer["offer"];
  if (const std::string why = ipc_refusal(header, last_, recipe_); !why.empty()) {
    ipc_write_frame(fd, {{"refused", why}});
    throw PolicyError("policy ipc receiver: " + why);
  }
  const cuda::DeviceGuard on(device_);
  const cudaStream_t stream = cuda::cu(Stream{});
  PolicySkeleton sk;
  size_t B = 0, buckets = 0;
  MappedSlots mapped;
  try {
    sk = policy_from_header(header, device_);
    B = offer.at("bucket_bytes").get<size_t>();
    buckets = offer.at("buckets").get<size_t>();
    if (B == 0 || buckets != bucket_count(sk.payload.payload_bytes, B))
      throw PolicyError(
          fmt::format("policy ipc receiver: {} buckets of {} bytes cannot carry a "
                      "{}-byte payload",
                      buckets, B, sk.payload.payload_bytes));
    for (const Json& s : offer.at("slots")) {
      cudaIpcMemHandle_t mh;
      cudaIpcEventHandle_t eh;
      from_hex(s.at("mem").get<std::string>(), &mh, sizeof mh, "a staging buffer handle");
      from_hex(s.at("event").get<std::string>(), &eh, sizeof eh, "a staging event handle");
      void* p = nullptr;
      LOCKSTEP_CUDA_CHECK(cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess));
      mapped.mem.push_back(p);
      cudaEvent_t e;
      LOCKSTEP_CUDA_CHECK(cudaIpcOpenEventHandle(&e, eh));
      mapped.events.push_back(e);
    }
    if (mapped.mem.empty()) throw PolicyError("policy ipc receiver: the offer has no staging slot");
  } catch (const std::exception& e) {
    ipc_write_frame(fd, {{"refused", e.what()}});
    throw;
  }
  ipc_write_frame(fd, {{"accept", true}});
  const auto t_accept = std::chrono::steady_clock::now();
  for (size_t b = 0; b < buckets; ++b) {
    const Json msg = ipc_read_frame(fd, "a bucket");
    const size_t s = msg.value("slot", size_t(0));
    if (msg.value("bucket", size_t(-1)) != b || s >= mapped.mem.size())
      throw PolicyError(
          fmt::format("policy ipc receiver: expected bucket {}, got {}", b, msg.dump()));
    LOCKSTEP_CUDA_CHECK(cudaStreamWaitEvent(stream, mapped.events[s], 0));
    for (const BucketCopy& c : bucket_copies(sk.payload, b, B)) {
      auto* dst = static_cast<char*>(sk.payload.parts[c.part].raw());
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst + c.part_offset,
                                          static_cast<const char*>(mapped.mem[s]) + c.bucket_offset,
                                          c.nbytes, cudaMemcpyDefault, stream));
    }
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));  // the slot may be refilled after this
    ipc_write_frame(fd, {{"done", b}});
  }
  const auto t_copied = std::chrono::steady_clock::now();
  PolicyVersion p = std::move(sk.policy);
  const uint64_t sum = policy_checksum(p);
  const auto t_verified = std::chrono::steady_clock::now();
  ipc_write_frame(fd, {{"verified", sum == p.checksum}, {"checksum", fmt::format("{:016x}", sum)}});
  if (sum != p.checksum)
    throw PolicyError(fmt::format(
        "policy ipc receiver: version {} checksum {:016x} does not verify (the received bytes "
        "hash to {:016x})",
        p.version, p.checksum, sum));
  last_ = p.version;
  if (stats) {
    stats->version = p.version;
    stats->checksum = p.checksum;
    stats->header_bytes = header.dump().size();
    stats->payload_bytes = sk.payload.payload_bytes;
    stats->buckets = int64_t(buckets);
    stats->staging_bytes = B * mapped.mem.size();
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats->setup_seconds = std::chrono::duration<double>(t_accept - t0).count();
    stats->transfer_seconds = std::chrono::duration<double>(t_copied - t_accept).count();
    stats->verify_seconds = std::chrono::duration<double>(t_verified - t_copied).count();
  }
  return p;
#endif
}

}  // namespace lockstep::model
