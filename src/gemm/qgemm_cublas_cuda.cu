// The fast large-M CUDA GEMM path (QgemmKernel::kCublas): each packed operand is dequantized
// exactly into its bf16 inner values (docs/gemm.md section 2: every inner value is a bf16 number),
// cuBLAS multiplies them with fp32 accumulation into an fp32 buffer, and the epilogue kernel
// applies the outer scales and the epilogue of section 4. The products are those of the contract;
// only the summation order is cuBLAS's own, so this path is within the analytic bound of section 5
// and bit-exact on grid inputs, but NOT batch-invariant (cuBLAS picks kernels and split-K by shape).
// cuBLAS is loaded with dlopen on first use: the library does not link it, and without it this
// path reports itself unavailable (qgemm_cublas_available) and refuses with a GemmError.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <algorithm>

#include "qgemm_cuda.cuh"

namespace lockstep::cuda::gemm_detail {
namespace {

struct CublasApi {
  void* lib = nullptr;
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                      const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  using GemmStridedFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                           const void*, const void*, cudaDataType, int, long long, const void*,
                                           cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                           long long, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmExFn gemm = nullptr;
  GemmStridedFn gemm_strided = nullptr;
  CublasApi() {
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) return;
    create = reinterpret_cast<decltype(create)>(dlsym(lib, "cublasCreate_v2"));
    set_stream = reinterpret_cast<decltype(set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    gemm = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
    gemm_strided = reinterpret_cast<GemmStridedFn>(dlsym(lib, "cublasGemmStridedBatchedEx"));
    if (!create || !set_stream || !gemm || !gemm_strided) lib = nullptr;
  }
};

const CublasApi& api() {
  static const CublasApi a;
  return a;
}

// One handle per host thread (a cuBLAS handle must not be used by two threads at once). Handles
// live until the process ends: destroying them from a thread_local destructor after the CUDA
// runtime has shut down is not safe.
cublasHandle_t handle() {
  thread_local cublasHandle_t h = nullptr;
  if (!h) {
    if (!api().lib) throw GemmError("qgemm cuda: the cuBLAS fast path needs libcublas (not found by dlopen)");
    if (api().create(&h) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("qgemm cuda: cublasCreate failed");
  }
  return h;
}

void check_status(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(cat("qgemm cuda: ", what, " failed: cuBLAS status ", int(st)));
}

constexpr int kDequantThreads = 256;

// out[r, k] = bf16 bits of the inner value of op(r, k), 16 elements per thread (the tiles' decode).
__global__ void __launch_bounds__(kDequantThreads) dequant_bf16_kernel(GemmOperandView op, uint16_t* out) {
  __shared__ OperandLuts lut;
  lut.pair[threadIdx.x] = pair_entry(op.format, op.elem, threadIdx.x);
  lut.scale[threadIdx.x] = scale_entry(op.format, threadIdx.x);
  __syncthreads();
  const int64_t kc = op.cols / 16, chunks = op.rows * kc;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * blockDim.x) {
    RawTile r;
    load_raw(op, c / kc, true, (c % kc) * 16, r);
    store_tile(op, lut, r, out + c * 16);
  }
}

// bf16 inner values of `op` (the data pointer itself for bf16 operands).
const uint16_t* dequantized(const GemmOperandView& op, uint16_t* scratch, cudaStream_t stream) {
  if (op.format == GemmFormat::kBf16) return static_cast<const uint16_t*>(op.data);
  const int64_t chunks = op.rows * (op.cols / 16);
  if (chunks == 0) return scratch;
  const int64_t blocks = std::min<int64_t>((chunks + kDequantThreads - 1) / kDequantThreads, 132 * 16);
  dequant_bf16_kernel<<<unsigned(blocks), kDequantThreads, 0, stream>>>(op, scratch);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return scratch;
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

bool cublas_available() { return api().lib != nullptr; }

void cublas_gemm_bf16(const void* a, const void* w, void* d, bool d_f32, int64_t m, int64_t n, int64_t k,
                      cudaStream_t stream, int batch, int64_t stride_a, int64_t stride_w, int64_t stride_d) {
  const float one = 1.0f, zero = 0.0f;
  cublasHandle_t h = handle();
  check_status(api().set_stream(h, stream), "cublasSetStream");
  const cudaDataType dt = d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  // Row-major D [m, n] = A [m, k] W [n, k]^T is column-major D^T = W^T(op T) A^T.
  if (batch == 1)
    check_status(api().gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, w, CUDA_R_16BF, int(k), a,
                            CUDA_R_16BF, int(k), &zero, d, dt, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  else
    check_status(api().gemm_strided(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, w, CUDA_R_16BF, int(k),
                                    stride_w, a, CUDA_R_16BF, int(k), stride_a, &zero, d, dt, int(n), stride_d, batch,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
}

void launch_cublas(const GemmOperandView& a, const GemmOperandView& w, int64_t n, const DeviceGroupTable& groups,
                   const DeviceEpilogue& ep, GemmOutView out, DeviceBuffer& workspace, cudaStream_t stream) {
  if (!cublas_available()) throw GemmError("qgemm cuda: the cuBLAS fast path needs libcublas (not found by dlopen)");
  const int64_t K = a.cols;
  if (K % 16 != 0 || K > INT32_MAX || n > INT32_MAX || groups.max_rows > INT32_MAX)
    throw GemmError(cat("qgemm cublas path: needs K % 16 == 0 and dimensions below 2^31 (K = ", K, ", N = ", n, ")"));
  if (groups.host.size() != size_t(groups.groups))
    throw GemmError("qgemm cublas path: the group table has no host copy (build it with make_group_table)");
  if (groups.groups == 0 || groups.total_rows == 0 || n == 0) return;
  const size_t a_bytes = a.format == GemmFormat::kBf16 ? 0 : align256(size_t(a.rows) * size_t(K) * 2);
  const size_t w_bytes = w.format == GemmFormat::kBf16 ? 0 : align256(size_t(w.rows) * size_t(K) * 2);
  const size_t acc_bytes = size_t(groups.total_rows) * size_t(n) * sizeof(float);
  if (workspace.size() < a_bytes + w_bytes + acc_bytes) workspace.resize(a_bytes + w_bytes + acc_bytes);
  uint8_t* base = workspace.as<uint8_t>();
  const uint16_t* ab = dequantized(a, reinterpret_cast<uint16_t*>(base), stream);
  const uint16_t* wb = dequantized(w, reinterpret_cast<uint16_t*>(base + a_bytes), stream);
  float* acc = reinterpret_cast<float*>(base + a_bytes + w_bytes);
  // Equal groups (every group the same row count, W experts back to back): one strided batched
  // call; otherwise one call per non-empty group.
  bool equal = true;
  for (const GemmGroupDesc& g : groups.host)
    equal = equal && g.rows == groups.host[0].rows && g.a_row0 == groups.host[0].a_row0 + (&g - groups.host.data()) * g.rows &&
            g.w_row0 == (&g - groups.host.data()) * n;
  if (equal && groups.groups > 1 && groups.host[0].rows > 0) {
    const GemmGroupDesc& g0 = groups.host[0];
    cublas_gemm_bf16(ab + g0.a_row0 * K, wb, acc + g0.a_row0 * n, true, g0.rows, n, K, stream, groups.groups,
                     int64_t(g0.rows) * K, n * K, int64_t(g0.rows) * n);
  } else {
    for (const GemmGroupDesc& g : groups.host)
      if (g.rows > 0) cublas_gemm_bf16(ab + g.a_row0 * K, wb + g.w_row0 * K, acc + g.a_row0 * n, true, g.rows, n, K, stream);
  }
  launch_epilogue(acc, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
}

}  // namespace lockstep::cuda::gemm_detail
