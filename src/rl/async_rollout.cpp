// The background rollout of --async-rollout 1 and the checkpoint form of its batch
// (async_rollout.h).
#include "async_rollout.h"

#include <fmt/format.h>

#include "lockstep/tensor/safetensors.h"
#include "stopwatch.h"

namespace lockstep::rl::detail {

RolloutThread::~RolloutThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::future<void> RolloutThread::run(std::function<void()> job) {
  std::packaged_task<void()> task(std::move(job));
  std::future<void> done = task.get_future();
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(task));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
  return done;
}

void RolloutThread::loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopped, and nothing left to run
      task = std::move(jobs_.front());
      jobs_.pop_front();
    }
    task();
  }
}

PendingRollout::PendingRollout(int64_t step, int64_t policy_version, RolloutThread& thread,
                               Device device, std::function<RolloutBatch()> sample)
    : step_(step), version_(policy_version) {
  done_ = thread.run([this, device, sample = std::move(sample)] {
    try {
      // The sampler's ops run where its tensors live (a thread starts on the first GPU).
      set_thread_device(device);
      const Clock::time_point t0 = Clock::now();
      batch_ = sample();
      generation_s_ = seconds_since(t0);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

PendingRollout::PendingRollout(int64_t step, int64_t policy_version, RolloutBatch batch,
                               double generation_s)
    : step_(step),
      version_(policy_version),
      batch_(std::move(batch)),
      generation_s_(generation_s) {}

PendingRollout::~PendingRollout() {
  if (done_.valid()) done_.wait();
}

const RolloutBatch& PendingRollout::wait() {
  if (done_.valid()) {
    const Clock::time_point t0 = Clock::now();
    done_.get();  // the job catches everything itself
    waited_s_ += seconds_since(t0);
  }
  if (error_) std::rethrow_exception(error_);
  return batch_;
}

RolloutBatch PendingRollout::take() {
  wait();
  return std::move(batch_);
}

namespace {

template <class T>
Tensor rollout_tensor(const std::vector<T>& v, DType dtype) {
  return Tensor::from_vector<T>(v, {int64_t(v.size())}, dtype);
}

}  // namespace

void save_rollout_samples(const std::filesystem::path& file,
                          std::span<const model::SampleResult> samples) {
  std::vector<int32_t> tokens, routing;
  std::vector<float> logprobs;
  std::vector<int64_t> token_offsets{0}, routing_offsets{0};
  std::vector<uint8_t> eos;
  bool routed = false;
  for (const model::SampleResult& s : samples) {
    if (s.logprobs.size() != s.tokens.size())
      throw std::logic_error(
          fmt::format("save_rollout_samples: a sample has {} tokens and {} log-probs",
                      s.tokens.size(), s.logprobs.size()));
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    logprobs.insert(logprobs.end(), s.logprobs.begin(), s.logprobs.end());
    routing.insert(routing.end(), s.routing.begin(), s.routing.end());
    token_offsets.push_back(int64_t(tokens.size()));
    routing_offsets.push_back(int64_t(routing.size()));
    eos.push_back(s.eos ? 1 : 0);
    routed = routed || !s.routing.empty();
  }
  SafetensorsFile f;
  f.tensors.push_back({"tokens", rollout_tensor(tokens, DType::kI32)});
  f.tensors.push_back({"logprobs", rollout_tensor(logprobs, DType::kF32)});
  f.tensors.push_back({"token_offsets", rollout_tensor(token_offsets, DType::kI64)});
  if (routed) {
    f.tensors.push_back({"routing_offsets", rollout_tensor(routing_offsets, DType::kI64)});
    f.tensors.push_back({"routing", rollout_tensor(routing, DType::kI32)});
  }
  f.tensors.push_back({"eos", rollout_tensor(eos, DType::kU8)});  // last: 1-byte elements
  f.metadata["lockstep.checkpoint"] = "rollout";
  write_safetensors(file.string(), f);
}

namespace {

// The 1-D array `name` of `dtype` in f (with `count` elements when count >= 0).
template <class T>
std::span<const T> stored_array(const SafetensorsFile& f, const std::filesystem::path& file,
                                const char* name, DType dtype, int64_t count) {
  const Tensor* t = f.find(name);
  if (!t)
    throw std::invalid_argument(
        fmt::format("rollout batch {}: the array '{}' is missing", file.string(), name));
  if (t->dtype() != dtype || t->dim() != 1 || (count >= 0 && t->numel() != count))
    throw std::invalid_argument(
        fmt::format("rollout batch {}: '{}' is {} {}; expected a 1-D {} array{}", file.string(),
                    name, dtype_name(t->dtype()), shape_string(t->shape()), dtype_name(dtype),
                    count >= 0 ? fmt::format(" of {} elements", count) : std::string()));
  return t->data<T>();
}

// Offsets [R + 1] from 0, never decreasing, ending at `total`.
void check_stored_offsets(std::span<const int64_t> o, int64_t total,
                          const std::filesystem::path& file, const char* name) {
  bool ok = !o.empty() && o.front() == 0 && o.back() == total;
  for (size_t i = 1; ok && i < o.size(); ++i) ok = o[i] >= o[i - 1];
  if (!ok)
    throw std::invalid_argument(
        fmt::format("rollout batch {}: '{}' must rise from 0 to {} (the stored elements)",
                    file.string(), name, total));
}

}  // namespace

std::vector<model::SampleResult> load_rollout_samples(const std::filesystem::path& file) {
  SafetensorsFile f;
  try {
    f = read_safetensors(file.string());
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("rollout batch: {}", e.what()));
  }
  const auto offsets = stored_array<int64_t>(f, file, "token_offsets", DType::kI64, -1);
  if (offsets.empty())
    throw std::invalid_argument(
        fmt::format("rollout batch {}: 'token_offsets' is empty", file.string()));
  const int64_t R = int64_t(offsets.size()) - 1;
  const auto tokens = stored_array<int32_t>(f, file, "tokens", DType::kI32, -1);
  const auto logprobs =
      stored_array<float>(f, file, "logprobs", DType::kF32, int64_t(tokens.size()));
  const auto eos = stored_array<uint8_t>(f, file, "eos", DType::kU8, R);
  check_stored_offsets(offsets, int64_t(tokens.size()), file, "token_offsets");
  std::span<const int32_t> routing;
  std::span<const int64_t> routing_offsets;
  if (f.find("routing")) {
    routing = stored_array<int32_t>(f, file, "routing", DType::kI32, -1);
    routing_offsets = stored_array<int64_t>(f, file, "routing_offsets", DType::kI64, R + 1);
    check_stored_offsets(routing_offsets, int64_t(routing.size()), file, "routing_offsets");
  }
  std::vector<model::SampleResult> out(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) {
    model::SampleResult& s = out[size_t(i)];
    const size_t a = size_t(offsets[size_t(i)]), b = size_t(offsets[size_t(i) + 1]);
    s.tokens.assign(tokens.begin() + ptrdiff_t(a), tokens.begin() + ptrdiff_t(b));
    s.logprobs.assign(logprobs.begin() + ptrdiff_t(a), logprobs.begin() + ptrdiff_t(b));
    s.eos = eos[size_t(i)] != 0;
    if (!routing.empty() || !routing_offsets.empty()) {
      const size_t ra = size_t(routing_offsets[size_t(i)]);
      const size_t rb = size_t(routing_offsets[size_t(i) + 1]);
      s.routing.assign(routing.begin() + ptrdiff_t(ra), routing.begin() + ptrdiff_t(rb));
    }
  }
  return out;
}

}  // namespace lockstep::rl::detail
