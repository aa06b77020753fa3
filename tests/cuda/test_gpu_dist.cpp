// lockstep_test_gpu --op dist: the NCCL transport as a one-rank group on the first GPU (all that
// one GPU allows): libnccl loads, NVLS is forced off, every collective leaves the bytes a group of
// one must leave, the fixed-tree gradient reduction on device slots equals tree_sum on the CPU bit
// for bit, and the weight broadcast's root path returns the version unchanged. Skipped (counted
// apart) in a build without NCCL.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../tiny_model_util.h"
#include "lockstep/dist/grad_reduce.h"
#include "lockstep/dist/nccl.h"
#include "lockstep/dist/policy_broadcast.h"
#include "lockstep/model/policy.h"
#include "lockstep/ops/tensor_ops.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {
namespace {

std::vector<uint8_t> host_bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  std::vector<uint8_t> out(h.nbytes());
  if (!out.empty()) std::memcpy(out.data(), h.raw(), out.size());
  return out;
}

Tensor ramp(int64_t n, float step, float offset) {
  std::vector<float> v(size_t(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = offset + step * float(i % 97) * float(1 + i % 5);
  return from_f32(v, {n});
}

std::string one_rank_group() {
  auto comm = dist::make_nccl_communicator(dist::nccl_unique_id(), 0, 1, gpu());
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (!nvls || std::string(nvls) != "0")
    return "NCCL_NVLS_ENABLE is not 0 after the communicator was made";
  const Tensor x = ramp(1000, 0.37f, -3.0f);
  Tensor t = x.to(gpu());
  comm->all_reduce_sum(t);
  if (host_bytes(t) != host_bytes(x)) return "all_reduce_sum of one rank changed the bytes";
  Tensor out(DType::kF32, {1000}, gpu());
  comm->all_gather(t, out);
  if (host_bytes(out) != host_bytes(x)) return "all_gather of one rank is not its input";
  comm->broadcast(t, 0);
  if (host_bytes(t) != host_bytes(x)) return "broadcast from rank 0 changed the bytes";
  comm->barrier();

  std::vector<Tensor> cpu_slots, gpu_slots;
  for (int s = 0; s < 4; ++s) {
    cpu_slots.push_back(ramp(777, 1e-3f * float(1 + s), float(s) - 1.5f));
    gpu_slots.push_back(cpu_slots.back().to(gpu()));
  }
  const Tensor want = ops::scale(dist::tree_sum(cpu_slots), 0.25);
  if (host_bytes(dist::reduce_gradients(*comm, gpu_slots, 0.25)) != host_bytes(want))
    return "reduce_gradients on the GPU differs from tree_sum on the CPU";

  test::TinyOptions o;
  o.moe = true;
  const model::PolicyVersion p =
      model::export_policy(test::tiny_weights(test::tiny_config(o), 5),
                           builtin_recipe_or_throw("nvfp4_per_token", "test_gpu").recipe, 1);
  dist::PolicyBroadcastStats stats;
  const model::PolicyVersion back =
      dist::broadcast_policy(*comm, &p, 1, "nvfp4_per_token", {0, 4096}, &stats);
  if (back.checksum != p.checksum || stats.payload_bytes != p.nbytes() || stats.buckets < 2)
    return "broadcast_policy's root path";
  std::printf("  dist: %s, policy %zu bytes in %lld buckets\n", comm->describe().c_str(),
              stats.payload_bytes, (long long)stats.buckets);
  return "";
}

}  // namespace

void test_dist() {
  if (!want("dist")) return;
  if (!dist::nccl_compiled()) {
    skip("dist/nccl_one_rank", "built without NCCL");
    return;
  }
  run_case("dist/nccl_one_rank", one_rank_group);
}

}  // namespace lockstep::gpu_test
