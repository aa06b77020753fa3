// undo_hadamard (quant/quantize.h): the exact inverse of the contract's 16-point transform
// (numerics/hadamard.h) applied chunk by chunk along the copy's rows.
#include <algorithm>

#include "lockstep/numerics/hadamard.h"
#include "lockstep/quant/quantize.h"

namespace lockstep {

void undo_hadamard(std::span<float> values, int64_t rows, int64_t cols, Copy copy) {
  float in[16], out[16];
  if (copy == Copy::kRowwise) {
    for (size_t k = 0; k + 16 <= values.size(); k += 16) {
      std::copy_n(values.data() + k, 16, in);
      num::inverse_hadamard16_chunk(in, out);
      std::copy_n(out, 16, values.data() + k);
    }
    return;
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r0 = 0; r0 + 16 <= rows; r0 += 16) {
      for (int i = 0; i < 16; ++i) in[i] = values[size_t((r0 + i) * cols + c)];
      num::inverse_hadamard16_chunk(in, out);
      for (int i = 0; i < 16; ++i) values[size_t((r0 + i) * cols + c)] = out[i];
    }
}

}  // namespace lockstep
