// lockstep_test_gpu: every CUDA op against the CPU reference (the specification) over format x
// scaling x copy x awkward shape x input dtype x value distribution, the CUDA GEMMs against the CPU
// path and the float64 oracle, the backward layouts and the device-resident chain.
// Usage: lockstep_test_gpu [--op OP] [--format F] [--only SUBSTR] [--kernel K] [--reduced]
//        [--shard I/N] [--seed S] [--mode test|perf] [--rows R --cols C]. The seed is printed and
// replayed with LOCKSTEP_TEST_SEED; the last line is "N passed, N failed, N skipped"; a filter
// that matches no case is a failure. --shard I/N keeps the cases whose name hashes to I modulo N,
// so N runs (scripts/gpu-check's SHARD, one per device call) run every case once.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "lockstep/tensor/device.h"
#include "quantize_bench.h"
#include "test_gpu.h"

namespace lockstep::gpu_test {
extern int g_pass, g_fail, g_skip;
extern const char* g_argv0;
void test_codec();
void test_quantize();
void test_dequantize();
void test_grouped();
void test_joint();
void test_given_amax();
void test_hadamard();
void test_colwise();
void test_fused();
void test_gemm();
void test_gemm_grouped();
void test_gemm_small_m();
void test_backward();
void test_chain();
void test_ops_basic();
void test_row_moves();
bool perf_ops_basic();
void test_softmax_family();
void perf_softmax_family();
void test_attention();
void test_kv_cache();
void test_model();
void test_dist();
void test_sync();
int sync_ipc_receiver_main(const std::string& socket, const std::string& recipe, int count);
}  // namespace lockstep::gpu_test

using namespace lockstep;
using namespace lockstep::gpu_test;

namespace {

constexpr const char* kOps =
    "quantize|dequantize|grouped|joint|hadamard|colwise|permute|swiglu|codec|gemm|gemm_grouped|"
    "gemm_small_m|"
    "backward|chain|rmsnorm|rope|embedding|adamw|grad_norm|elementwise|softmax|log_softmax|"
    "moe|layout|token_logprobs|router|sample"
    "|attention|attention_prefill|attention_backward|kv_cache|attention_cached|model|dist|sync";

int usage(const char* argv0, int rc) {
  std::printf(
      "usage: %s [--op %s]\n"
      "          [--format nvfp4|mxfp8|fp8|bf16] [--only SUBSTR] [--kernel KERNEL] [--reduced] "
      "[--seed S]\n"
      "          [--shard I/N] [--mode test|perf] [--rows R --cols C]\n"
      "  --shard I/N: only the cases whose name hashes to I modulo N (0 <= I < N)\n"
      "  --kernel: run every GEMM case on one kernel (cuda_tiled, cuda_decode, "
      "cuda_decode_block_split,\n"
      "            cuda_wgmma, cuda_wgmma_inloop, cuda_wgmma_staged, cuda_wgmma_wreg128, "
      "cuda_wgmma_wreg256,\n"
      "            cuda_wgmma_small_m, cuda_wgmma_small_m_wide, cuda_cublas); cases that kernel "
      "cannot take are skipped\n"
      "  example: LOCKSTEP_TEST_SEED=7 %s --op colwise --format nvfp4 --only '96x256'\n",
      argv0, kOps, argv0);
  return rc;
}

uint64_t initial_seed() {
  if (const char* e = std::getenv("LOCKSTEP_TEST_SEED")) return std::strtoull(e, nullptr, 0);
  return (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
}

}  // namespace

int main(int argc, char** argv) {
  g_argv0 = argv[0];
  g_opt.seed = initial_seed();
  // The receiving process of --op sync's CUDA IPC case (this program started again by itself).
  if (argc == 5 && std::string(argv[1]) == "--sync-ipc-receiver")
    return sync_ipc_receiver_main(argv[2], argv[3], std::atoi(argv[4]));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "lockstep_test_gpu: missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--op")
      g_opt.op = next();
    else if (a == "--format")
      g_opt.format = next();
    else if (a == "--only")
      g_opt.only = next();
    else if (a == "--seed")
      g_opt.seed = std::stoull(next());
    else if (a == "--mode")
      g_opt.mode = next();
    else if (a == "--reduced")
      g_opt.reduced = true;
    else if (a == "--shard") {
      const std::string v = next();
      int i = -1, n = 0;
      char tail = 0;
      if (std::sscanf(v.c_str(), "%d/%d%c", &i, &n, &tail) != 2 || n < 1 || i < 0 || i >= n) {
        std::fprintf(stderr, "lockstep_test_gpu: --shard '%s' is not I/N with 0 <= I < N\n",
                     v.c_str());
        return usage(argv[0], 2);
      }
      g_opt.shard = i;
      g_opt.shards = n;
    } else if (a == "--rows")
      g_opt.rows = std::stoll(next());
    else if (a == "--cols")
      g_opt.cols = std::stoll(next());
    else if (a == "--kernel") {
      const std::string k = next();
      const auto kernel = gemm_variant_from_name(k);
      if (!kernel || *kernel == GemmVariant::kCpu) {
        std::fprintf(stderr, "lockstep_test_gpu: unknown CUDA kernel '%s'\n", k.c_str());
        return usage(argv[0], 2);
      }
      g_opt.kernel = *kernel;
    } else {
      return usage(argv[0], a == "--help" ? 0 : 2);
    }
  }
  if (g_opt.mode != "test" && g_opt.mode != "perf") return usage(argv[0], 2);
  std::printf("lockstep_test_gpu seed %llu (replay with LOCKSTEP_TEST_SEED=%llu)\n",
              (unsigned long long)g_opt.seed, (unsigned long long)g_opt.seed);
  std::fflush(stdout);
  try {
    require_device(gpu());
    if (g_opt.mode == "perf" && !g_opt.op.empty() &&
        (want("softmax") || want("log_softmax") || want("token_logprobs") || want("router") ||
         want("sample"))) {
      perf_softmax_family();
      std::printf("0 passed, 0 failed, 0 skipped\n");
      return 0;
    }
    if (g_opt.mode == "perf") {
      if (perf_ops_basic()) return 0;  // --op rmsnorm, rope, ...: those ops' timings
      const auto rows = bench::bench_quantize_cuda(g_opt.rows, g_opt.cols, g_opt.only);
      std::printf("%s", bench::format_quant_bench(rows).c_str());
      std::printf("%zu passed, 0 failed, 0 skipped\n", rows.size());
      return 0;
    }
    test_codec();
    test_quantize();
    test_dequantize();
    test_grouped();
    test_joint();
    test_given_amax();
    test_hadamard();
    test_colwise();
    test_fused();
    test_gemm();
    test_gemm_grouped();
    test_gemm_small_m();
    test_backward();
    test_chain();
    test_ops_basic();
    test_row_moves();
    test_softmax_family();
    test_attention();
    test_kv_cache();
    test_model();
    test_dist();
    test_sync();
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    ++g_fail;
  }
  const int ran = g_pass + g_fail;
  if (ran == 0) {
    std::printf(
        "FAIL: no case matched the filters (--op '%s' --format '%s' --only '%s'%s%s)\n",
        g_opt.op.c_str(), g_opt.format.c_str(), g_opt.only.c_str(),
        g_opt.shards > 1
            ? (" --shard " + std::to_string(g_opt.shard) + "/" + std::to_string(g_opt.shards))
                  .c_str()
            : "",
        g_opt.kernel == GemmVariant::kAuto ? ""
                                           : ", every GEMM case skipped for the forced kernel");
    ++g_fail;
  }
  std::printf("%d passed, %d failed, %d skipped\n", g_pass, g_fail, g_skip);
  return g_fail == 0 ? 0 : 1;
}
