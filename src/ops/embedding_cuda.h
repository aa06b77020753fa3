// CUDA kernels of the token embedding (private; called by tensor_ops_embedding.cpp in CUDA
// builds): F32 device pointers, I32 ids on the device (never read on the host), the thread's
// current stream, no host synchronisation.
#pragma once

#include <cstdint>

#include "lockstep/tensor/device.h"

namespace lockstep::ops {

// table: [vocab, d]; ids: [tokens]; out: [tokens, d]; an id outside [0, vocab) gives a NaN row.
void embedding_fwd_cuda(const float* table, int64_t vocab, int64_t d, const int32_t* ids,
                        int64_t tokens, float* out, Device device);
// dout: [tokens, d]; dtable: [vocab, d], overwritten: a stable radix sort of the token indices by
// id, then a block per vocabulary row summing its tokens in ascending order (embedding_bwd_sum);
// tokens with an id outside [0, vocab) add to no row.
void embedding_bwd_cuda(const float* dout, const int32_t* ids, int64_t tokens, int64_t vocab,
                        int64_t d, float* dtable, Device device);

}  // namespace lockstep::ops
