// Token sampling CPU kernel (ops/sampling.h): the definition composed from the header's pieces, one
// row at a time (rows in parallel): stats over HostLanes<1024>, candidates (index order or sorted),
// block sums, the prefix chain and the inverse CDF.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "check.h"
#include "lockstep/ops/sampling.h"

namespace lockstep::ops {

void check_sample_config(const SampleConfig& cfg, int64_t vocab) {
  detail::require(std::isfinite(cfg.temperature) && cfg.temperature > 0.0,
                  "sample_tokens: temperature {} must be finite and > 0", cfg.temperature);
  detail::require(cfg.top_k >= 0, "sample_tokens: top_k {} must be >= 0", cfg.top_k);
  detail::require(cfg.top_p > 0.0 && cfg.top_p <= 1.0, "sample_tokens: top_p {} must be in (0, 1]",
                  cfg.top_p);
  detail::require(vocab >= 1 && vocab <= kSampleMaxVocab,
                  "sample_tokens: vocabulary of {} tokens; need 1 <= V <= {}", vocab,
                  kSampleMaxVocab);
}

namespace {

struct RowScratch {
  std::vector<float> lp;     // [V] log-probs
  std::vector<int32_t> idx;  // [V] the sorted order (sorted path)
  std::vector<float> P;      // [nb] block sums, then prefixes
};

void sample_row(const float* x, int64_t V, float inv_t, const SampleConfig& cfg, float u,
                RowScratch& s, int32_t* token, float* logprob) {
  if (cfg.top_k == 1) {
    sample_greedy_row(HostVocabLanes{}, x, V, inv_t, token, logprob);
    return;
  }
  const RowStats<float> st = sample_stats_row(HostVocabLanes{}, x, V, inv_t);
  if (!sample_row_valid(st)) {
    *token = -1;
    *logprob = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  s.lp.resize(size_t(V));
  for (int64_t j = 0; j < V; ++j) s.lp[size_t(j)] = sample_logprob(x[j], inv_t, st);
  const bool sorted = cfg.top_k > 0 || cfg.top_p < 1.0;
  int64_t n = V;
  if (sorted) {
    s.idx.resize(size_t(V));
    std::iota(s.idx.begin(), s.idx.end(), 0);
    const float* lp = s.lp.data();
    std::sort(s.idx.begin(), s.idx.end(),
              [lp](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
    if (cfg.top_k > 0) n = std::min(cfg.top_k, V);
  }
  const auto index = [&](int64_t i) { return sorted ? int64_t(s.idx[size_t(i)]) : i; };
  const auto w = [&](int64_t i) { return sample_weight(s.lp[size_t(index(i))]); };
  const int64_t nb = (n + kSampleBlock - 1) / kSampleBlock;
  s.P.resize(size_t(nb));
  for (int64_t b = 0; b < nb; ++b)
    s.P[size_t(b)] = sample_block_sum(w, b * kSampleBlock, std::min(n, (b + 1) * kSampleBlock));
  sample_prefix_chain(s.P.data(), nb);
  const float* P = s.P.data();
  const auto first_block = [P](int64_t lim, float thr, bool at_least) {
    for (int64_t b = 0; b < lim; ++b)
      if (at_least ? P[b] >= thr : P[b] > thr) return b;
    return lim;
  };
  const auto scan = [&](int64_t begin, int64_t end, float base, float thr, bool at_least,
                        float* q) {
    return sample_scan_block(w, begin, end, base, thr, at_least, q);
  };
  const int64_t i = sample_pick(n, P, cfg.top_p < 1.0, float(cfg.top_p), u, first_block, scan);
  const int64_t j = index(i);
  *token = int32_t(j);
  *logprob = sample_logprob(x[j], inv_t, st);
}

}  // namespace

void sample_tokens_cpu(const float* logits, int64_t rows, int64_t vocab, const uint32_t* streams,
                       const int64_t* positions, const SampleConfig& cfg, int32_t* tokens,
                       float* logprobs) {
  check_sample_config(cfg, vocab);
  detail::require(rows >= 0, "sample_tokens: {} rows", rows);
  const float inv_t = sampling_scale(cfg.temperature);
#pragma omp parallel if (rows * vocab * 16 >= detail::kParallelMinWork)
  {
    RowScratch s;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      sample_row(logits + r * vocab, vocab, inv_t, cfg,
                 sampling_uniform(cfg.seed, streams[r], positions[r]), s, tokens + r, logprobs + r);
  }
}

}  // namespace lockstep::ops
