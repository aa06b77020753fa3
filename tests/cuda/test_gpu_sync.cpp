// lockstep_test_gpu --op sync: the device digest equals the host's on random and edge sizes (0
// bytes, odd tails, misaligned views, a batch); one-GPU sync (export_policy on the GPU, then
// Sampler::load_policy there) gives the host path's policy bit for bit and copies nothing to the
// host but the 8-byte digests; CUDA IPC between two processes (this program re-run as the
// receiver) moves versions in many buckets, verified on the receiver's GPU, with the refusals
// (recipe, versions going backwards, on either side) named.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../tiny_model_util.h"
#include "lockstep/model/policy.h"
#include "lockstep/model/policy_ipc.h"
#include "lockstep/model/policy_wire.h"
#include "lockstep/model/sampler.h"
#include "lockstep/numerics/philox.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/tensor/digest.h"
#include "test_gpu.h"

extern char** environ;

namespace lockstep::gpu_test {
extern const char* g_argv0;
namespace {

Tensor random_u8(size_t n, uint64_t seed) {
  Tensor t(DType::kU8, {int64_t(n)});
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < n; ++i) p[i] = uint8_t(num::philox_element_word(seed, 11, i));
  return t;
}

std::string digest_sizes() {
  const uint64_t seed = case_seed("sync/digest_sizes");
  std::vector<size_t> sizes{0, 1, 7, 8, 9, 15, 16, 17, 255, 4095, 4096, 4097};
  for (size_t n : {size_t(1) << 20, (size_t(1) << 20) + 3, size_t(50'000'003)}) sizes.push_back(n);
  std::vector<Tensor> host, dev;
  for (const size_t n : sizes) {
    host.push_back(random_u8(n, seed + n));
    dev.push_back(host.back().to(gpu()));
    // Misaligned views: the same bytes from offsets 1, 3 and 5 of a larger buffer.
    for (const int64_t off : {1, 3, 5}) {
      Tensor h = random_u8(n + 8, seed + n + off);
      host.push_back(h.slice_rows(off, off + int64_t(n)));
      dev.push_back(h.to(gpu()).slice_rows(off, off + int64_t(n)));
    }
  }
  const std::vector<uint64_t> want = tensor_digests64(host);
  const int64_t d2h0 = device_to_host_copies();
  const std::vector<uint64_t> got = tensor_digests64(dev);
  if (device_to_host_copies() - d2h0 != 1)
    return "the batch of device digests took " + std::to_string(device_to_host_copies() - d2h0) +
           " device-to-host copies (want 1)";
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i])
      return "device digest of " + dev[i].describe() + " (case " + std::to_string(i) +
             ") differs from the host's";
    if (tensor_digest64(dev[i]) != want[i])
      return "a single device digest differs, case " + std::to_string(i);
  }
  // Twice: the same value (no state left in the slots).
  if (tensor_digests64(dev) != got) return "a second run gave other digests";
  return "";
}

const lockstep::Recipe& sync_recipe(const char* name) {
  return builtin_recipe_or_throw(name, "test_gpu").recipe;
}

std::vector<uint8_t> sync_host_bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<uint8_t> out(h.nbytes());
  if (!out.empty()) std::memcpy(out.data(), h.raw(), out.size());
  return out;
}

std::string one_gpu_sync(const char* rname) {
  test::TinyOptions o;
  o.moe = true;
  const model::ModelWeights w = test::tiny_weights(test::tiny_config(o), 7);
  model::ModelWeights wd = w;
  for (auto& [name, t] : wd.tensors) t = t.to(gpu());
  const lockstep::Recipe& r = sync_recipe(rname);
  const model::PolicyVersion ph = model::export_policy(w, r, 1);
  model::SamplerConfig sc;
  sc.device = gpu();
  model::Sampler sampler(sc);
  synchronize(gpu());
  const int64_t d2h0 = device_to_host_copies();
  model::PolicyVersion pd = model::export_policy(wd, r, 1);
  const uint64_t stamped = pd.checksum;
  const model::PolicyLayout l = model::policy_layout(pd);
  sampler.load_policy(std::move(pd), 1, r.name);
  synchronize(gpu());
  const int64_t copies = device_to_host_copies() - d2h0;
  // Two checksums (the converter's stamp, the sampler's check), one 8-bytes-per-tensor copy each.
  if (copies != 2)
    return std::to_string(copies) + " device-to-host copies during convert + load (want 2)";
  if (stamped != ph.checksum) return "the GPU version's checksum differs from the host path's";
  const model::PolicyLayout lh = model::policy_layout(ph);
  if (l.header.dump() != lh.header.dump()) return "the GPU version's header differs";
  for (size_t i = 0; i < l.payload.parts.size(); ++i) {
    if (!l.payload.parts[i].is_cuda()) return "a part of the GPU version is not on the GPU";
    if (sync_host_bytes(l.payload.parts[i]) != sync_host_bytes(lh.payload.parts[i]))
      return "part " + std::to_string(i) + " differs from the host path's bytes";
  }
  std::printf("  sync/one_gpu %s: %zu bytes, %zu tensors, %lld host copies (digests only)\n", rname,
              l.payload.payload_bytes, l.payload.parts.size(), (long long)copies);
  return "";
}

// This program as the receiving process: --sync-ipc-receiver SOCKET RECIPE COUNT.
int spawn_receiver(const std::string& socket, const std::string& rname, int count) {
  const std::string self = "/proc/self/exe", cnt = std::to_string(count);
  std::vector<char*> argv{
      const_cast<char*>(g_argv0),        const_cast<char*>("--sync-ipc-receiver"),
      const_cast<char*>(socket.c_str()), const_cast<char*>(rname.c_str()),
      const_cast<char*>(cnt.c_str()),    nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return int(pid);
}

int wait_exit(int pid) {
  int status = 0;
  if (waitpid(pid_t(pid), &status, 0) != pid_t(pid)) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

model::PolicyVersion tiny_version(const char* rname, int64_t v) {
  test::TinyOptions o;
  o.moe = true;
  model::ModelWeights w = test::tiny_weights(test::tiny_config(o), 9 + uint64_t(v));
  for (auto& [name, t] : w.tensors) t = t.to(gpu());
  return model::export_policy(w, sync_recipe(rname), v);
}

std::string ipc_two_processes() {
  const std::string sock = "/tmp/lockstep_test_ipc_" + std::to_string(::getpid());
  model::PolicyIpcOptions opt{4096, 2};  // small buckets: many of them, both slots reused
  // 1. Two versions to one receiver process, then its refusal of a version going backwards.
  {
    const int child = spawn_receiver(sock, "nvfp4_per_token", 3);
    if (child < 0) return "cannot start the receiver process";
    std::string err;
    {
      model::PolicyIpcSender tx(sock, gpu(), opt);
      for (const int64_t v : {1, 2}) {
        const model::PolicyVersion p = tiny_version("nvfp4_per_token", v);
        const model::PolicyIpcStats st = tx.serve(p);
        if (st.buckets < 4 || st.payload_bytes != p.nbytes() || st.checksum != p.checksum)
          err = "version " + std::to_string(v) + ": unexpected stats";
        std::printf("  sync/ipc: version %lld, %zu bytes in %lld buckets, %.3f s\n", (long long)v,
                    st.payload_bytes, (long long)st.buckets, st.seconds);
      }
      try {
        tx.serve(tiny_version("nvfp4_per_token", 1));
        err = "the sender served version 1 after 2";
      } catch (const model::PolicyError&) {
      }
    }
    {
      model::PolicyIpcSender tx(sock, gpu(), opt);  // a new sender that starts at version 1
      try {
        tx.serve(tiny_version("nvfp4_per_token", 1));
        err = "the receiver took version 1 after 2";
      } catch (const model::PolicyError& e) {
        if (std::string(e.what()).find("versions only move forward") == std::string::npos)
          err = std::string("backwards refusal: ") + e.what();
      }
    }
    const int rc = wait_exit(child);
    if (rc != 3) return "the receiver process exited " + std::to_string(rc) + " (want 3: refused)";
    if (!err.empty()) return err;
  }
  // 2. A receiver that expects another recipe refuses before any bucket moves.
  {
    const int child = spawn_receiver(sock, "mxfp8", 1);
    model::PolicyIpcSender tx(sock, gpu(), opt);
    std::string err = "the sender's serve returned";
    try {
      tx.serve(tiny_version("nvfp4_per_token", 1));
    } catch (const model::PolicyError& e) {
      err = std::string(e.what()).find("expects 'mxfp8'") == std::string::npos
                ? std::string("recipe refusal: ") + e.what()
                : "";
    }
    const int rc = wait_exit(child);
    if (rc != 3) return "the mxfp8 receiver exited " + std::to_string(rc) + " (want 3)";
    if (!err.empty()) return err;
  }
  return "";
}

}  // namespace

// The receiving process of ipc_two_processes: receives up to COUNT versions (retrying the
// connection while the parent swaps senders), exit 0 when all verified, 3 on a refusal.
int sync_ipc_receiver_main(const std::string& socket, const std::string& rname, int count) {
  try {
    model::PolicyIpcReceiver rx(gpu(), rname);
    for (int i = 0; i < count; ++i) {
      for (int attempt = 0;; ++attempt) {
        try {
          const model::PolicyVersion p = rx.receive(socket);
          std::printf("  receiver: version %lld checksum %016llx\n", (long long)p.version,
                      (unsigned long long)p.checksum);
          break;
        } catch (const model::PolicyError& e) {
          // Between two senders the socket may be missing or closing: connect again.
          const std::string m = e.what();
          const bool between = m.find("no sender listening") != std::string::npos ||
                               m.find("the sender's offer") != std::string::npos;
          if (!between || attempt > 200) throw;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    }
  } catch (const model::PolicyError& e) {
    std::printf("  receiver refused: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::printf("  receiver failed: %s\n", e.what());
    return 1;
  }
  return 0;
}

void test_sync() {
  if (!want("sync")) return;
  run_case("sync/digest_sizes", digest_sizes);
  for (const char* r : {"bf16", "nvfp4_per_token", "mxfp8", "fp8_block"})
    run_case(std::string("sync/one_gpu/") + r, [r] { return one_gpu_sync(r); });
  run_case("sync/ipc_two_processes", ipc_two_processes);
}

}  // namespace lockstep::gpu_test
