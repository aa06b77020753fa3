// Tensor-level layout ops: zero padding and cropping of 2-D tensors and of expert-grouped weights,
// column splits and concatenations, row gathers. Each is one entry that runs where its tensor lives
// (2-D block copies of tensor/storage.h on the CPU or on a CUDA stream); none changes a value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "lockstep/tensor/tensor.h"

namespace lockstep::ops {

// x [rows, cols] zero-padded to [rows_to, cols_to] (x itself when nothing is added).
Tensor pad2d(const Tensor& x, int64_t rows_to, int64_t cols_to);
// The leading [rows, cols] block of x (x itself when it is that shape), contiguous.
Tensor crop2d(const Tensor& x, int64_t rows, int64_t cols);
// A grouped weight [groups * n, k] padded per group to [groups * n_to, k_to].
Tensor pad_groups(const Tensor& w, int64_t groups, int64_t n_to, int64_t k_to);
// The inverse: [groups * n_to, k_to] -> [groups * n, k].
Tensor crop_groups(const Tensor& w, int64_t groups, int64_t n, int64_t k);

// x [T, sum(widths)] -> contiguous column blocks [T, widths[i]].
std::vector<Tensor> split_cols(const Tensor& x, std::initializer_list<int64_t> widths);
// Column blocks [T, c_i] (same rows and dtype, one device) -> [T, sum c_i].
Tensor concat_cols(std::initializer_list<Tensor> parts);

}  // namespace lockstep::ops
