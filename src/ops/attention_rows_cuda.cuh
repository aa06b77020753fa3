// The warp executor of the CUDA attention_row kernels (private to ops/): WarpLanes with per-key
// values kept in a per-warp shared-memory ring, so that reading key j back (key(v, j), every lane,
// ascending j) is one broadcast load instead of a shuffle per 32-bit word. Same order, same bits.
#pragma once

#include "lockstep/ops/attention.h"
#include "lockstep/ops/row_exec.h"

namespace lockstep::ops::attention_cuda::detail {

// ring: this warp's 2 * 32 slots of `slot_floats` floats. attention_row keeps at most two per-key
// arrays alive (the chunk's scores, then its probabilities), so per_key / map_keys alternate
// between the two halves; each starts with __syncwarp(), which orders the new writes after every
// lane's last read of the half's previous contents.
struct WarpSmemLanes : WarpLanes {
  float* ring = nullptr;
  int slot_floats = 0;
  mutable int next = 0;

  template <class T>
  struct Keys {
    const T* buf;
    T own;  // this lane's key (lanes >= nc: T{})
  };

  template <class T>
  __device__ T* take() const {
    T* buf = reinterpret_cast<T*>(ring + next * kWarpLanes * slot_floats);
    next ^= 1;
    return buf;
  }

  template <class T, class F>
  __device__ Keys<T> per_key(int nc, F&& f) const {
    T* buf = take<T>();
    __syncwarp();
    const T own = lane < nc ? f(lane) : T{};
    if (lane < nc) buf[lane] = own;
    __syncwarp();
    return {buf, own};
  }
  template <class R, class T, class F>
  __device__ Keys<R> map_keys(const Keys<T>& in, int nc, F&& f) const {
    R* buf = take<R>();
    __syncwarp();
    const R own = lane < nc ? f(in.own) : R{};
    if (lane < nc) buf[lane] = own;
    __syncwarp();
    return {buf, own};
  }
  template <class T>
  __device__ T key(const Keys<T>& k, int j) const {
    return k.buf[j];
  }
};

}  // namespace lockstep::ops::attention_cuda::detail
