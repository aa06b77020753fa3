// The fast large-M CUDA GEMM path (GemmVariant::kCublas): each packed operand is dequantized
// exactly into its bf16 inner values (docs/gemm.md section 2: every inner value is a bf16 number),
// cuBLAS multiplies them with fp32 accumulation into an fp32 buffer, and the epilogue kernel
// applies the outer scales and the epilogue of section 4 (skipped when D = acc: cuBLAS then writes
// the output itself). The products are those of the contract;
// only the summation order is cuBLAS's own, so this path is within the analytic bound of section 5
// and bit-exact on grid inputs, but NOT batch-invariant (cuBLAS picks kernels and split-K by
// shape). cuBLAS is loaded with dlopen on first use: the library does not link it, and without it
// this path reports itself unavailable (qgemm_cublas_available) and refuses with a GemmError.
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
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  using GemmStridedFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                           int, int, int, const void*, const void*, cudaDataType,
                                           int, long long, const void*, cudaDataType, int,
                                           long long, const void*, void*, cudaDataType, int,
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
    if (!api().lib)
      throw GemmError("qgemm cuda: the cuBLAS fast path needs libcublas (not found by dlopen)");
    if (api().create(&h) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("qgemm cuda: cublasCreate failed");
  }
  return h;
}

void check_status(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(cat("qgemm cuda: ", what, " failed: cuBLAS status ", int(st)));
}

constexpr int kDequantThreads = 256;

// out[r, k] = bf16 bits of the inner value of op(r, k) (the tiles' decode, format known at compile
// time). The operand is contiguous [rows, K] with compact scales, so half-piece h covers elements
// [8 h, 8 h + 8): nvfp4 bytes [4 h, +4) and scale h / 2, 8-bit codes bytes [8 h, +8) and (mxfp8)
// scale h / 4 (K % 32 == 0): no row / column arithmetic. Thread i of the grid writes the 16 bytes
// of half-pieces i, i + T, i + 2T, ... (T threads): every store instruction of a warp covers 512
// contiguous bytes. Two half-pieces per iteration, both loaded before either is decoded.
// Launched with programmatic dependent launch: the tables are built while the previous kernel in
// the stream finishes; the operand is read and `out` written only after pdl_wait().
template <Format F>
__global__ void __launch_bounds__(kDequantThreads)
    dequant_bf16_kernel(GemmOperandView op, uint16_t* out) {
  __shared__ OperandLuts lut;
  pdl_launch_dependents();
  lut.pair[threadIdx.x] = pair_entry(op.format, op.elem, threadIdx.x);
  lut.scale[threadIdx.x] = scale_entry(op.format, threadIdx.x);
  __syncthreads();
  pdl_wait();
  const int64_t halves = op.rows * (op.cols / 8), stride = int64_t(gridDim.x) * blockDim.x;
  const uint8_t* d = static_cast<const uint8_t*>(op.data);
  auto load = [&](int64_t h, RawTile& r) {
    r.valid = true;
    r.v[0] = r.v[1] = make_uint4(0, 0, 0, 0);
    r.scale = 0;
    if (h >= halves) return;
    if constexpr (F == Format::kNvfp4) {
      r.v[0].x = __ldg(reinterpret_cast<const uint32_t*>(d + h * 4));
      r.scale = __ldg(op.block_scale + (h >> 1));
    } else {
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(d + h * 8));
      r.v[0].x = x.x, r.v[0].y = x.y;
      if constexpr (F == Format::kMxfp8) r.scale = __ldg(op.block_scale + (h >> 2));
    }
  };
  auto store = [&](int64_t h, const RawTile& r) {
    if (h >= halves) return;
    uint32_t o[4];
    dequant16_p<F>([&](uint32_t b) { return lut.pair[b]; }, lut.scale, r, o);
    *reinterpret_cast<uint4*>(out + h * 8) = make_uint4(o[0], o[1], o[2], o[3]);
  };
  for (int64_t h = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; h < halves; h += 2 * stride) {
    RawTile r0, r1;
    load(h, r0);
    load(h + stride, r1);
    store(h, r0);
    store(h + stride, r1);
  }
}

}  // namespace

const uint16_t* dequantized(const GemmOperandView& op, uint16_t* scratch, cudaStream_t stream) {
  if (op.format == Format::kBf16) return static_cast<const uint16_t*>(op.data);
  const int64_t halves = op.rows * (op.cols / 8);
  if (halves == 0) return scratch;
  const int64_t blocks =
      std::min<int64_t>((halves + 2 * kDequantThreads - 1) / (2 * kDequantThreads), 132 * 16);
  auto* kernel = op.format == Format::kNvfp4   ? dequant_bf16_kernel<Format::kNvfp4>
                 : op.format == Format::kMxfp8 ? dequant_bf16_kernel<Format::kMxfp8>
                                               : dequant_bf16_kernel<Format::kFp8>;
  launch_pdl(kernel, dim3(unsigned(blocks)), dim3(kDequantThreads), 0, stream, op, scratch);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
  return scratch;
}

namespace {

// The epilogue of docs/gemm.md section 4 (steps 1-3 and 5; no SwiGLU) on cuBLAS's fp32 result,
// four columns per thread (16-byte loads of acc, outer scales and bias; N % 4 == 0). The same
// per-element functions as launch_epilogue; only the vector width differs.
__global__ void epilogue4_kernel(const float* acc, GemmOperandView a, GemmOperandView w, int64_t n,
                                 const GemmGroupDesc* groups, DeviceEpilogue ep, GemmOutView out) {
  const GemmGroupDesc G = groups[blockIdx.z];
  for (int64_t r = blockIdx.y; r < G.rows; r += gridDim.y) {
    const int64_t orow = G.a_row0 + r;
    const float oa = outer_of(a, orow);
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4; c < n;
         c += int64_t(gridDim.x) * blockDim.x * 4) {
      float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (r < G.tokens) {
        const float4 v = *reinterpret_cast<const float4*>(acc + orow * n + c);
        const float4 ow = w.outer ? *reinterpret_cast<const float4*>(w.outer + G.w_row0 + c)
                                  : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        const float vv[4] = {v.x, v.y, v.z, v.w}, oo[4] = {ow.x, ow.y, ow.z, ow.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) y[q] = epilogue_value(vv[q], oa, oo[q], ep, G.w_row0 + c + q);
      }
      if (out.d_bf16) {
        const uint32_t lo =
            uint32_t(num::f32_to_bf16(y[0])) | (uint32_t(num::f32_to_bf16(y[1])) << 16);
        const uint32_t hi =
            uint32_t(num::f32_to_bf16(y[2])) | (uint32_t(num::f32_to_bf16(y[3])) << 16);
        *reinterpret_cast<uint2*>(out.d_bf16 + orow * n + c) = make_uint2(lo, hi);
      } else {
        *reinterpret_cast<float4*>(out.d_f32 + orow * n + c) = make_float4(y[0], y[1], y[2], y[3]);
      }
    }
  }
}

void launch_epilogue_fast(const float* acc, const GemmOperandView& a, const GemmOperandView& w,
                          int64_t n, const DeviceGroupTable& groups, const DeviceEpilogue& ep,
                          GemmOutView out, cudaStream_t stream) {
  if (ep.swiglu || n % 4 != 0) {
    launch_epilogue(acc, 1, groups.total_rows, a, w, n, groups, ep, out, stream);
    return;
  }
  const int threads = 256;
  const dim3 grid(unsigned((n / 4 + threads - 1) / threads),
                  unsigned(std::min<int64_t>(groups.max_rows, 65535)), unsigned(groups.groups));
  epilogue4_kernel<<<grid, threads, 0, stream>>>(acc, a, w, n, groups.device_table(), ep, out);
  LOCKSTEP_CUDA_CHECK_LAUNCH();
}

// Whether D = acc exactly, so cuBLAS can write the output itself: both outer scales are 1 by format
// (bf16, mxfp8), alpha is 1 (bit for bit), no bias, no SwiGLU, no padding rows. cuBLAS then rounds
// acc to the output type itself (bf16: RNE, as f32_to_bf16; tested on grid inputs).
bool identity_epilogue(const GemmOperandView& a, const GemmOperandView& w,
                       const DeviceGroupTable& groups, const DeviceEpilogue& ep) {
  auto unit_outer = [](const GemmOperandView& op) {
    return op.format == Format::kBf16 || op.format == Format::kMxfp8;
  };
  if (!unit_outer(a) || !unit_outer(w) || num::f32_bits(ep.alpha) != num::f32_bits(1.0f) ||
      ep.bias || ep.swiglu)
    return false;
  for (const GemmGroupDesc& g : groups.host)
    if (g.tokens != g.rows) return false;
  return true;
}

}  // namespace

}  // namespace lockstep::cuda::gemm_detail

namespace lockstep::cuda {

bool cublas_available() { return gemm_detail::api().lib != nullptr; }

void cublas_gemm_bf16(const void* a, const void* w, void* d, bool d_f32, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream, int batch, int64_t stride_a, int64_t stride_w,
                      int64_t stride_d) {
  const float one = 1.0f, zero = 0.0f;
  cublasHandle_t h = gemm_detail::handle();
  gemm_detail::check_status(gemm_detail::api().set_stream(h, stream), "cublasSetStream");
  const cudaDataType dt = d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  // Row-major D [m, n] = A [m, k] W [n, k]^T is column-major D^T = W^T(op T) A^T.
  if (batch == 1)
    gemm_detail::check_status(
        gemm_detail::api().gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, w,
                                CUDA_R_16BF, int(k), a, CUDA_R_16BF, int(k), &zero, d, dt, int(n),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  else
    gemm_detail::check_status(
        gemm_detail::api().gemm_strided(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one,
                                        w, CUDA_R_16BF, int(k), stride_w, a, CUDA_R_16BF, int(k),
                                        stride_a, &zero, d, dt, int(n), stride_d, batch,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

}  // namespace lockstep::cuda

namespace lockstep::cuda::gemm_detail {

void launch_cublas(const GemmOperandView& a, const GemmOperandView& w, int64_t n,
                   const DeviceGroupTable& groups, const DeviceEpilogue& ep, GemmOutView out,
                   Scratch& scratch, cudaStream_t stream) {
  if (!cublas_available())
    throw GemmError("qgemm cuda: the cuBLAS fast path needs libcublas (not found by dlopen)");
  const int64_t K = a.cols;
  if (K % 16 != 0 || K > INT32_MAX || n > INT32_MAX || groups.max_rows > INT32_MAX)
    throw GemmError(cat("qgemm cublas path: needs K % 16 == 0 and dimensions below 2^31 (K = ", K,
                        ", N = ", n, ")"));
  if (!groups.on_host())
    throw GemmError(
        "qgemm cublas path: needs the group offsets on the host (it loops over the groups); pass "
        "host "
        "offsets or choose another kernel");
  if (groups.groups == 0 || groups.total_rows == 0 || n == 0) return;
  const size_t a_bytes = bf16_copy_bytes(a);
  const size_t w_bytes = bf16_copy_bytes(w);
  const bool direct = identity_epilogue(a, w, groups, ep);
  const size_t acc_bytes = direct ? 0 : size_t(groups.total_rows) * size_t(n) * sizeof(float);
  uint8_t* base = static_cast<uint8_t*>(scratch.bytes(a_bytes + w_bytes + acc_bytes));
  const uint16_t* ab = dequantized(a, reinterpret_cast<uint16_t*>(base), stream);
  const uint16_t* wb = dequantized(w, reinterpret_cast<uint16_t*>(base + a_bytes), stream);
  // acc: cuBLAS's output, fp32 before the epilogue kernel, or the final output when D = acc.
  const bool acc_f32 = !direct || out.d_f32;
  const size_t esize = acc_f32 ? sizeof(float) : sizeof(uint16_t);
  uint8_t* acc = direct ? (out.d_f32 ? reinterpret_cast<uint8_t*>(out.d_f32)
                                     : reinterpret_cast<uint8_t*>(out.d_bf16))
                        : base + a_bytes + w_bytes;
  // Equal groups (every group the same row count, W experts back to back): one strided batched
  // call; otherwise one call per non-empty group.
  bool equal = true;
  for (const GemmGroupDesc& g : groups.host)
    equal = equal && g.rows == groups.host[0].rows &&
            g.a_row0 == groups.host[0].a_row0 + (&g - groups.host.data()) * g.rows &&
            g.w_row0 == (&g - groups.host.data()) * n;
  if (equal && groups.groups > 1 && groups.host[0].rows > 0) {
    const GemmGroupDesc& g0 = groups.host[0];
    cublas_gemm_bf16(ab + g0.a_row0 * K, wb, acc + size_t(g0.a_row0 * n) * esize, acc_f32, g0.rows,
                     n, K, stream, groups.groups, int64_t(g0.rows) * K, n * K,
                     int64_t(g0.rows) * n);
  } else {
    for (const GemmGroupDesc& g : groups.host)
      if (g.rows > 0)
        cublas_gemm_bf16(ab + g.a_row0 * K, wb + g.w_row0 * K, acc + size_t(g.a_row0 * n) * esize,
                         acc_f32, g.rows, n, K, stream);
  }
  if (!direct)
    launch_epilogue_fast(reinterpret_cast<float*>(acc), a, w, n, groups, ep, out, stream);
}

}  // namespace lockstep::cuda::gemm_detail
