// Row executors: the one reduction order of every ops/ row function, and its host and device
// implementations. A row function (rmsnorm_row, log_softmax_row, attention_row, ...) is written
// once as a LOCKSTEP_HD template over an executor `X`; the CPU backend calls it with a host
// executor, the CUDA backend with a warp or block executor, and both compute the same bits because
// every sum and max goes through the executor, whose order is fixed here:
//
//   sum over j in [0, n) of f(j) with L lanes (L a power of two, fixed per op, never derived from
//   the batch or the device): lane l sums f(l), f(l + L), f(l + 2L), ... in ascending j from +0;
//   then the partials combine by a fixed tree: for off = L/2, L/4, ..., 1: p[l] = p[l] + p[l + off]
//   for every l < off; the result is p[0]. Every step is one rounded operation of T.
//   max over j: the same lanes and tree with a > b ? a : b (lanes start at -inf).
//   sum2 over j of a pair (a_j, b_j): two sums in one pass over j, each component in exactly the
//   order (lanes and tree) of sum, so sum2(...).a has the bits of sum over the a_j.
//
// Ops choose L = 32 (rows up to a few thousand: norms, head norms, router, SwiGLU sums, a warp per
// row on the GPU) or L = 1024 (vocabulary-sized rows: log-softmax, token log-probs, sampling; a
// 1024-thread block per row). Elementwise steps (for_each) have no order to fix. for_each, sum,
// sum2 and max give element j to the same lane (thread) l = j % L, so a row function may store a
// value in for_each and read it back in a later reduction of the same lane without a barrier.
//
// Per-key executors for attention (attention.h): a chunk of up to 32 keys is spread over 32 lanes
// (one key per lane), head dimensions over the same lanes (d = lane, lane + 32, ...); per-key
// values are read back by key index in ascending order, so sequential sums over keys keep their
// order on both sides. per_key computes a value per key, map_keys an elementwise step on such
// values, key(k, j) reads key j's value back (every lane, converged), for_dims visits dimensions.
#pragma once

#include <cstdint>
#include <limits>

#include "lockstep/numerics/hd.h"

namespace lockstep::ops {

inline constexpr int kWarpLanes = 32;
inline constexpr int kBlockLanes = 1024;

// The two components of a sum2 (one pass, two sums).
template <class T>
struct Sum2 {
  T a, b;
};

// ---- host
// ----------------------------------------------------------------------------------------

template <int L>
struct HostLanes {
  static_assert(L >= 1 && (L & (L - 1)) == 0, "lanes must be a power of two");
  static constexpr int kLanes = L;
  // Per-key and per-dimension storage of the attention executor: plain arrays on the host.
  template <class T>
  struct Keys {
    T v[kWarpLanes];
  };
  template <class T, int MaxDim>
  struct Dims {
    T v[MaxDim];
    T& operator[](int i) { return v[i]; }
    const T& operator[](int i) const { return v[i]; }
  };

  bool leader() const { return true; }

  template <class T, class F>
  T sum(int64_t n, F&& f) const {
    T p[L];
    for (int l = 0; l < L; ++l) p[l] = T(0);
    int64_t j = 0;
    for (; j + L <= n; j += L)
      for (int l = 0; l < L; ++l) p[l] = p[l] + f(j + l);
    for (int l = 0; j + l < n; ++l) p[l] = p[l] + f(j + l);
    for (int off = L / 2; off >= 1; off /= 2)
      for (int l = 0; l < off; ++l) p[l] = p[l] + p[l + off];
    return p[0];
  }

  template <class T, class F>
  Sum2<T> sum2(int64_t n, F&& f) const {
    T pa[L], pb[L];
    for (int l = 0; l < L; ++l) pa[l] = pb[l] = T(0);
    for (int64_t j0 = 0; j0 < n; j0 += L)
      for (int l = 0; l < L && j0 + l < n; ++l) {
        const Sum2<T> v = f(j0 + l);
        pa[l] = pa[l] + v.a;
        pb[l] = pb[l] + v.b;
      }
    for (int off = L / 2; off >= 1; off /= 2)
      for (int l = 0; l < off; ++l) {
        pa[l] = pa[l] + pa[l + off];
        pb[l] = pb[l] + pb[l + off];
      }
    return {pa[0], pb[0]};
  }

  template <class T, class F>
  T max(int64_t n, F&& f) const {
    T p[L];
    for (int l = 0; l < L; ++l) p[l] = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const T x = f(j);
      T& a = p[j % L];
      a = x > a ? x : a;
    }
    for (int off = L / 2; off >= 1; off /= 2)
      for (int l = 0; l < off; ++l) p[l] = p[l + off] > p[l] ? p[l + off] : p[l];
    return p[0];
  }

  template <class F>
  void for_each(int64_t n, F&& f) const {
    for (int64_t j = 0; j < n; ++j) f(j);
  }

  // Attention: f(j) for the keys j < nc of a chunk (nc <= 32).
  template <class T, class F>
  Keys<T> per_key(int nc, F&& f) const {
    Keys<T> k;
    for (int j = 0; j < nc; ++j) k.v[j] = f(j);
    return k;
  }
  // f(value of key j) for the keys j < nc: an elementwise step on per-key values.
  template <class R, class T, class F>
  Keys<R> map_keys(const Keys<T>& in, int nc, F&& f) const {
    Keys<R> k;
    for (int j = 0; j < nc; ++j) k.v[j] = f(in.v[j]);
    return k;
  }
  template <class T>
  T key(const Keys<T>& k, int j) const {
    return k.v[j];
  }
  // f(d, i) for every dimension d < D; i indexes a Dims array of at least MaxDim entries.
  template <int MaxDim = 256, class F>
  void for_dims(int64_t D, F&& f) const {
    for (int64_t d = 0; d < D; ++d) f(d, int(d));
  }
  // max over d < D <= MaxDim of f(d, i), i as for_dims gives it: max's lanes, order and bits, for
  // values a row function keeps in a Dims array (registers on the GPU) instead of memory.
  template <int MaxDim, class T, class F>
  T max_dims(int64_t D, F&& f) const {
    return max<T>(D, [&](int64_t d) { return f(d, int(d)); });
  }
};

using HostWarp = HostLanes<kWarpLanes>;
using HostBlock = HostLanes<kBlockLanes>;

// ---- device
// --------------------------------------------------------------------------------------
#if defined(__CUDACC__)

// One warp per row; every lane of the warp calls the row function (converged at each collective).
struct WarpLanes {
  static constexpr int kLanes = kWarpLanes;
  int lane;  // threadIdx.x % 32

  template <class T>
  struct Keys {
    T v;  // this lane's key
  };
  // Dimension d lives in lane d % 32 at index d / 32.
  template <class T, int MaxDim>
  struct Dims {
    T v[(MaxDim + kWarpLanes - 1) / kWarpLanes];
    __device__ T& operator[](int i) { return v[i]; }
    __device__ const T& operator[](int i) const { return v[i]; }
  };

  __device__ bool leader() const { return lane == 0; }

  // A lane's values j = lane, lane + 32, ... are computed (loaded) U at a time before any of them
  // is combined, so that their loads are in flight together (a warp alone on a row of a few
  // thousand values would otherwise wait for one load at a time): chunks of 8, then of 4, then
  // one by one. `combine` takes the values in ascending j, as the plain loop would.
  template <int U, class V, class F, class C>
  __device__ static void chunks(int64_t& j, int64_t n, F& f, C& combine) {
    for (; j + (U - 1) * kWarpLanes < n; j += U * kWarpLanes) {
      V v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = f(j + u * kWarpLanes);
#pragma unroll
      for (int u = 0; u < U; ++u) combine(v[u]);
    }
  }
  template <class V, class F, class C>
  __device__ void ahead(int64_t n, F& f, C& combine) const {
    int64_t j = lane;
    chunks<8, V>(j, n, f, combine);
    chunks<4, V>(j, n, f, combine);
    chunks<1, V>(j, n, f, combine);
  }

  template <class T, class F>
  __device__ T sum(int64_t n, F&& f) const {
    T p = T(0);
    auto add = [&](T x) { p = p + x; };
    ahead<T>(n, f, add);
#pragma unroll
    for (int off = kWarpLanes / 2; off >= 1; off /= 2) {
      const T o = __shfl_down_sync(0xffffffffu, p, off);
      if (lane < off) p = p + o;
    }
    return __shfl_sync(0xffffffffu, p, 0);
  }

  template <class T, class F>
  __device__ Sum2<T> sum2(int64_t n, F&& f) const {
    T pa = T(0), pb = T(0);
    auto add = [&](const Sum2<T>& v) {
      pa = pa + v.a;
      pb = pb + v.b;
    };
    ahead<Sum2<T>>(n, f, add);
#pragma unroll
    for (int off = kWarpLanes / 2; off >= 1; off /= 2) {
      const T oa = __shfl_down_sync(0xffffffffu, pa, off);
      const T ob = __shfl_down_sync(0xffffffffu, pb, off);
      if (lane < off) {
        pa = pa + oa;
        pb = pb + ob;
      }
    }
    return {__shfl_sync(0xffffffffu, pa, 0), __shfl_sync(0xffffffffu, pb, 0)};
  }

  // The lanes' maxima combined by max's tree; every lane gets the result.
  template <class T>
  __device__ T max_tree(T p) const {
#pragma unroll
    for (int off = kWarpLanes / 2; off >= 1; off /= 2) {
      const T o = __shfl_down_sync(0xffffffffu, p, off);
      if (lane < off) p = o > p ? o : p;
    }
    return __shfl_sync(0xffffffffu, p, 0);
  }

  template <class T, class F>
  __device__ T max(int64_t n, F&& f) const {
    T p = -std::numeric_limits<T>::infinity();
    auto keep = [&](T x) { p = x > p ? x : p; };
    ahead<T>(n, f, keep);
    return max_tree(p);
  }

  template <class F>
  __device__ void for_each(int64_t n, F&& f) const {
    for (int64_t j = lane; j < n; j += kWarpLanes) f(j);
  }

  template <class T, class F>
  __device__ Keys<T> per_key(int nc, F&& f) const {
    Keys<T> k;
    k.v = lane < nc ? f(lane) : T{};
    return k;
  }
  template <class R, class T, class F>
  __device__ Keys<R> map_keys(const Keys<T>& in, int nc, F&& f) const {
    Keys<R> k;
    k.v = lane < nc ? f(in.v) : R{};
    return k;
  }
  // T of any size that is a multiple of 4 bytes (several heads' values of one key): word by word.
  template <class T>
  __device__ T key(const Keys<T>& k, int j) const {
    static_assert(sizeof(T) % 4 == 0, "per-key values are whole 32-bit words");
    if constexpr (sizeof(T) == 4) {
      return __shfl_sync(0xffffffffu, k.v, j);
    } else {
      T r;
      const uint32_t* src = reinterpret_cast<const uint32_t*>(&k.v);
      uint32_t* dst = reinterpret_cast<uint32_t*>(&r);
#pragma unroll
      for (int w = 0; w < int(sizeof(T) / 4); ++w) dst[w] = __shfl_sync(0xffffffffu, src[w], j);
      return r;
    }
  }
  // Unrolled to MaxDim / 32 steps so that Dims arrays stay in registers.
  template <int MaxDim = 256, class F>
  __device__ void for_dims(int64_t D, F&& f) const {
#pragma unroll
    for (int i = 0; i < (MaxDim + kWarpLanes - 1) / kWarpLanes; ++i) {
      const int64_t d = lane + int64_t(i) * kWarpLanes;
      if (d < D) f(d, i);
    }
  }
  // Lane l takes d = l, l + 32, ... in ascending order, as max does, unrolled as for_dims.
  template <int MaxDim, class T, class F>
  __device__ T max_dims(int64_t D, F&& f) const {
    T p = -std::numeric_limits<T>::infinity();
#pragma unroll
    for (int i = 0; i < (MaxDim + kWarpLanes - 1) / kWarpLanes; ++i) {
      const int64_t d = lane + int64_t(i) * kWarpLanes;
      if (d < D) {
        const T x = f(d, i);
        p = x > p ? x : p;
      }
    }
    return max_tree(p);
  }
};

// One block of kBlockLanes threads per row; `scratch` is shared memory for kBlockLanes values of
// the widest T used (8 KiB for double). Every thread of the block calls the row function.
struct BlockLanes {
  static constexpr int kLanes = kBlockLanes;
  int tid;        // threadIdx.x, blockDim.x == kBlockLanes
  void* scratch;  // __shared__, kBlockLanes * sizeof(T) bytes

  __device__ bool leader() const { return tid == 0; }

  template <class T, class Op>
  __device__ T tree(T p, Op op) const {
    T* s = static_cast<T*>(scratch);
    // Cross-warp levels (off >= 32) through shared memory, then the warp levels by shuffles.
    s[tid] = p;
    __syncthreads();
    for (int off = kBlockLanes / 2; off >= kWarpLanes; off /= 2) {
      if (tid < off) s[tid] = op(s[tid], s[tid + off]);
      __syncthreads();
    }
    if (tid < kWarpLanes) {
      p = s[tid];
#pragma unroll
      for (int off = kWarpLanes / 2; off >= 1; off /= 2) {
        const T o = __shfl_down_sync(0xffffffffu, p, off);
        if (tid < off) p = op(p, o);
      }
      if (tid == 0) s[0] = p;
    }
    __syncthreads();
    const T r = s[0];
    __syncthreads();  // s may be reused by the next collective
    return r;
  }

  // The loops are unrolled so that several loads of a lane are in flight at once; the adds stay
  // in ascending j.
  template <class T, class F>
  __device__ T sum(int64_t n, F&& f) const {
    T p = T(0);
#pragma unroll 4
    for (int64_t j = tid; j < n; j += kBlockLanes) p = p + f(j);
    return tree(p, [](T a, T b) { return a + b; });
  }

  template <class T, class F>
  __device__ Sum2<T> sum2(int64_t n, F&& f) const {
    T pa = T(0), pb = T(0);
#pragma unroll 4
    for (int64_t j = tid; j < n; j += kBlockLanes) {
      const Sum2<T> v = f(j);
      pa = pa + v.a;
      pb = pb + v.b;
    }
    const T a = tree(pa, [](T x, T y) { return x + y; });
    return {a, tree(pb, [](T x, T y) { return x + y; })};
  }

  template <class T, class F>
  __device__ T max(int64_t n, F&& f) const {
    T p = -std::numeric_limits<T>::infinity();
#pragma unroll 4
    for (int64_t j = tid; j < n; j += kBlockLanes) {
      const T x = f(j);
      p = x > p ? x : p;
    }
    return tree(p, [](T a, T b) { return b > a ? b : a; });
  }

  template <class F>
  __device__ void for_each(int64_t n, F&& f) const {
    for (int64_t j = tid; j < n; j += kBlockLanes) f(j);
  }
};

#endif  // __CUDACC__

}  // namespace lockstep::ops
