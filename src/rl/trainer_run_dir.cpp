// The run folder of the trainer: creating a run, resuming one (every check before any file
// changes), the folder lock one writer holds, atomic checkpoints, and the results written into
// run_meta.json at the end.
#include <fmt/format.h>

#include "dir_util.h"
#include "lockstep/diag/report.h"
#include "lockstep/model/policy.h"
#include "lockstep/recipe/registry.h"
#include "lockstep/rl/warm_start.h"
#include "lockstep/tensor/file_io.h"
#include "trainer_impl.h"

namespace lockstep::rl {
namespace fs = std::filesystem;

model::LearnerConfig learner_config(const TrainOptions& o) {
  model::LearnerConfig c;
  c.adamw.lr = o.lr;
  c.adamw.beta1 = o.beta1;
  c.adamw.beta2 = o.beta2;
  c.adamw.eps = o.adam_eps;
  c.adamw.weight_decay = o.weight_decay;
  c.max_grad_norm = o.max_grad_norm;
  c.mode = o.deterministic ? model::ExecMode::kDeterministic : model::ExecMode::kFast;
  c.temperature = o.temperature;
  c.seed = o.seed;
  c.device = o.device;
  c.kv = o.learner_kv == "match" && o.kv_cache == "fp8" ? model::KvDtype::kFp8E4M3
                                                        : model::KvDtype::kBf16;
  return c;
}

std::vector<Device> learner_devices(const TrainOptions& o) {
  std::vector<Device> d;
  for (int r = 0; r < o.learner_ranks; ++r)
    d.push_back(o.device.is_cpu() ? Device::cpu() : Device::cuda(o.device.index + r));
  return d;
}

std::unique_ptr<dist::RankGroup> learner_group(const TrainOptions& o) {
  if (o.learner_ranks == 1) return dist::make_solo_rank_group(o.device);
  if (o.device.is_cpu()) return dist::make_fake_rank_group(o.learner_ranks);
  const std::vector<Device> devices = learner_devices(o);
  return dist::make_nccl_rank_group(devices);
}

namespace {

Json read_json_file(const fs::path& p, const std::string& what) {
  std::string text;
  try {
    text = read_input_file(p.string());  // a FIFO or device in a run folder is refused
  } catch (const InputPathError& e) {
    throw std::invalid_argument(fmt::format("{}: cannot read {}", what, e.what()));
  }
  try {
    return parse_json(text);
  } catch (const std::exception& e) {
    throw std::invalid_argument(
        fmt::format("{}: {} is not valid JSON ({})", what, p.string(), e.what()));
  }
}

std::unique_ptr<model::Decoder> reference_decoder(const model::ModelWeights& w, const Recipe& r,
                                                  Device device) {
  model::DecoderWeights dw;
  dw.config = w.config;
  dw.plan = model::plan_for(w.config, r);
  for (const auto& [name, t] : w.tensors) dw.tensors[name] = t.to(Device::cpu()).clone().to(device);
  return std::make_unique<model::Decoder>(std::move(dw));
}

}  // namespace

void check_new_run_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec))
    throw std::invalid_argument(
        fmt::format("run folder '{}' exists and is not a folder", dir.string()));
  // Empty, or holding only the lock file a process that ended before writing anything left.
  bool empty = true;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    empty = empty && e.path().filename() == detail::kLockFile;
  if (ec)
    throw std::invalid_argument(
        fmt::format("run folder '{}': cannot list it: {}", dir.string(), ec.message()));
  if (!empty)
    throw std::invalid_argument(fmt::format(
        "run folder '{}' exists and is not empty (continue it with --resume {}, or choose another "
        "--out)",
        dir.string(), dir.string()));
}

namespace {

// Differences between two configs, for messages: "hidden_size 64 vs 32, ...".
std::string config_diff(const model::ModelConfig& a, const model::ModelConfig& b) {
  const Json ja = model::config_to_json(a), jb = model::config_to_json(b);
  std::string out;
  for (const auto& [k, v] : ja.items())
    if (!jb.contains(k) || jb.at(k) != v)
      out += fmt::format("{}{} {} vs {}", out.empty() ? "" : ", ", k, v.dump(),
                         jb.contains(k) ? jb.at(k).dump() : "absent");
  return out.empty() ? "same fields" : out;
}

}  // namespace

namespace {

// The rows a resume at checkpoint step `step` > 0 keeps: one complete, readable row for every
// step 0..step, in order. Rows after them (complete or cut short) are cut and rewritten by the
// resumed run; a missing, cut-short or unreadable row at or before `step` cannot be rewritten
// (its step is not run again), so it is an error naming the line.
void check_kept_rows(const fs::path& path, int64_t step) {
  std::string text;
  try {
    text = read_input_file(path.string());
  } catch (const InputPathError& e) {
    throw std::invalid_argument(fmt::format("--resume: {}", e.what()));
  }
  int64_t expected = 0;  // the next step a kept row must have
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size() && expected <= step) {
    ++line_no;
    const size_t nl = text.find('\n', pos);
    const std::string_view line =
        std::string_view(text).substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    if (nl == std::string::npos)
      throw std::invalid_argument(fmt::format(
          "--resume: {}:{}: the row is cut short (no end of line) where the row of step {} "
          "belongs; the checkpoint is at step {}, so that step cannot be written again",
          path.string(), line_no, expected, step));
    const Json row = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded() || !row.is_object() || !row.contains("step") ||
        !row["step"].is_number_integer())
      throw std::invalid_argument(fmt::format(
          "--resume: {}:{}: not a metrics row (a JSON object with an integer \"step\"); rows up "
          "to the checkpoint's step {} must all be readable",
          path.string(), line_no, step));
    const int64_t s = row["step"].get<int64_t>();
    if (s > step) break;
    if (s != expected)
      throw std::invalid_argument(
          fmt::format("--resume: {}:{}: a row of step {} where the row of step {} belongs (rows "
                      "0..{} must be there in order)",
                      path.string(), line_no, s, expected, step));
    ++expected;
  }
  if (expected <= step)
    throw std::invalid_argument(fmt::format(
        "--resume: {}: the rows end before step {}, but the checkpoint is at step {}; the "
        "missing steps cannot be written again",
        path.string(), expected, step));
}

}  // namespace

bool is_run_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / run_files::kRunMeta, ec)) return false;
  if (!fs::is_regular_file(dir / run_files::kCheckpoint / run_files::kTrainerState, ec))
    return false;
  try {
    return read_json_file(dir / run_files::kRunMeta, "run").value("command", "") == "train";
  } catch (const std::exception&) {
    return false;
  }
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;
const TrainOptions& Trainer::options() const { return impl_->opt; }
const Recipe& Trainer::recipe() const { return impl_->recipe; }
int64_t Trainer::step() const { return impl_->step; }
const fs::path& Trainer::run_dir() const { return impl_->dir; }

namespace {

// Refuses, before anything is written, a model whose persistent state cannot fit in the device's
// free memory.
void check_device_memory(const model::ModelWeights& w, Device device, bool async_rollout) {
  if (device.is_cpu()) return;
  int64_t params = 0;
  for (const auto& [name, t] : w.tensors) params += t.numel();
  // fp32 masters, gradients and two AdamW moments (16 B), the KL reference (4 B), two sampler
  // policies (the run's and the bf16 one, up to 2 B each), with --async-rollout 1 a third (the
  // version the background rollout samples): activations and KV caches come on top.
  const int bytes = async_rollout ? 26 : 24;
  const size_t need = size_t(params) * size_t(bytes);
  const auto [free, total] = device_memory(device);
  if (need > free)
    throw std::invalid_argument(fmt::format(
        "the model needs at least {:.2f} GiB on {} ({} parameters x {} bytes: masters, gradients, "
        "AdamW moments, the KL reference and {} sampler policies, before activations and the KV "
        "cache); {:.2f} GiB of {:.2f} GiB are free",
        double(need) / double(1ull << 30), device.str(), params, bytes, async_rollout ? 3 : 2,
        double(free) / double(1ull << 30), double(total) / double(1ull << 30)));
}

}  // namespace

std::unique_ptr<Trainer> Trainer::create(const fs::path& dir, const TrainOptions& options,
                                         const SelectedRecipe& sel, const model::ModelWeights& init,
                                         RunMetaExtras meta) {
  options.validate();
  check_task_model(init.config, max_sequence_length(options), "model");
  if (options.routing_replay) model::require_moe_for_replay(init.config, "--routing-replay");
  check_new_run_dir(dir);
  for (const Device& d : learner_devices(options))
    check_device_memory(init, d, options.async_rollout != 0);
  auto m = std::make_unique<Impl>();
  m->dir = dir;
  m->opt = options;
  m->recipe = sel.recipe;
  m->guard = parse_guard(options.guard);
  m->task = &find_task(options.task);
  {
    std::vector<detail::LearnerReplica> replicas;
    for (const Device& d : learner_devices(options)) {
      model::LearnerConfig lc = learner_config(options);
      lc.device = d;
      replicas.push_back({std::make_unique<model::Learner>(init, sel.recipe, lc),
                          reference_decoder(init, sel.recipe, d)});
    }
    m->ranks = std::make_unique<detail::LearnerRanks>(std::move(replicas), learner_group(options),
                                                      options.grad_slots);
  }
  if (options.sampler_recipe) {
    // The converter must be able to export this model with the sampler's recipe (block sizes
    // against the model's shapes): checked before the folder exists.
    try {
      (void)model::export_policy(init, *options.sampler_recipe, 0);
    } catch (const std::exception& e) {
      throw std::invalid_argument(
          fmt::format("--sampler-recipe {}: {}", options.sampler_recipe->name, e.what()));
    }
  }

  fs::create_directories(dir);
  // One process per run folder: the lock, then the check again, since another process may have
  // filled the folder between the first check and the lock.
  m->lock = std::make_unique<detail::FolderLock>(dir);
  check_new_run_dir(dir);
  m->lock->record_holder();
  save_warm_start(dir / run_files::kReference, init, Json::object());
  m->save_checkpoint();
  m->metrics.emplace(dir / diag::kMetricsFileName, diag::MetricsWriterOptions{.truncate = true});
  meta.command = "train";
  meta.device = options.device.str();
  meta.layers = int(init.config.num_hidden_layers);
  meta.seeds["seed"] = options.seed;
  meta.extra["guard"] = options.guard;
  meta.extra["deterministic"] = options.deterministic;
  // Both precisions label the run: the learner's recipe is run_meta's "recipe"; the sampler's.
  meta.extra["sampler_recipe"] = {
      {"name", options.sampler_recipe ? options.sampler_recipe->name : sel.recipe.name},
      {"shared_contract",
       !options.sampler_recipe || to_json(*options.sampler_recipe) == to_json(sel.recipe)},
      {"kv_cache", options.kv_cache},
      {"learner_kv", learner_config(options).kv == model::KvDtype::kFp8E4M3 ? "fp8" : "bf16"}};
  // How many evaluation problems have an equivalent (the same canonical form) among the run's
  // training prompts: 0 by construction of the split, measured here.
  const int64_t overlap = count_prompt_overlap(
      *m->task, options.seed, options.difficulty, options.steps * options.prompts,
      options.eval_prompts, parse_split(options.eval_split));
  meta.extra["task"] = {{"name", options.task},
                        {"difficulty", options.difficulty},
                        {"eval_prompts", options.eval_prompts},
                        {"eval_split", options.eval_split},
                        {"eval_prompts_seen_in_training", overlap}};
  meta.extra["options"] = options_to_json(options);
  // The ranks this run started with (a resume may use another count: the bits do not change).
  meta.extra["learner_ranks"] = options.learner_ranks;
  meta.extra["learner_group"] = m->ranks->group().describe();
  // The rollout schedule (also in "options"): 1, step k trains on a batch of version max(0, k - 2)
  // sampled while step k - 1 trained.
  meta.extra["async_rollout"] = options.async_rollout;
  meta.extra["model_config"] = model::config_to_json(init.config);
  write_run_meta(dir / run_files::kRunMeta, sel, meta);
  return std::unique_ptr<Trainer>(new Trainer(std::move(m)));
}

namespace {

// The batch of step `step` + 1 that an --async-rollout 1 checkpoint at `step` holds (trainer.json
// "pending_rollout" and rollout.safetensors), rebuilt as the run sampled it; null for a run
// without overlapped rollouts and for a checkpoint at step 0 or the last step (nothing pending).
std::unique_ptr<detail::PendingRollout> load_pending_rollout(const TrainOptions& o,
                                                             const Task& task, int64_t step,
                                                             const Json& state,
                                                             const fs::path& ck) {
  const Json pj = state.value("pending_rollout", Json());
  const bool expected = o.async_rollout && step > 0 && step < o.steps;
  const std::string where = (ck / run_files::kTrainerState).string();
  if (!expected) {
    if (!pj.is_null())
      throw std::invalid_argument(fmt::format(
          "--resume: {} holds a rollout batch for step {}, but the run (--async-rollout {}, step "
          "{} of {}) has none pending",
          where, pj.value("step", int64_t(-1)), o.async_rollout, step, o.steps));
    return nullptr;
  }
  // Step k + 1's batch was sampled during step k by the version that step started from.
  const int64_t want_step = step + 1, want_version = step - 1;
  if (!pj.is_object() || pj.value("step", int64_t(-1)) != want_step ||
      pj.value("policy_version", int64_t(-1)) != want_version)
    throw std::invalid_argument(fmt::format(
        "--resume: {} of an --async-rollout 1 run at step {} must hold the batch of step {} "
        "sampled by policy version {} (\"pending_rollout\"), and holds {}",
        where, step, want_step, want_version, pj.dump()));
  RolloutOptions ro;
  ro.group = o.group;
  ro.reward = parse_reward_kind(o.reward);
  ro.format_bonus = o.format_bonus;
  std::vector<model::SampleResult> samples =
      detail::load_rollout_samples(ck / run_files::kPendingRollout);
  if (int64_t(samples.size()) != o.prompts * o.group)
    throw std::invalid_argument(
        fmt::format("--resume: {} holds {} samples; the run samples {} per step ({} x {})",
                    (ck / run_files::kPendingRollout).string(), samples.size(), o.prompts * o.group,
                    o.prompts, o.group));
  RolloutBatch b = score_rollout(
      task, rollout_examples(task, o.seed, o.difficulty, uint64_t(step * o.prompts), o.prompts),
      std::move(samples), ro);
  return std::make_unique<detail::PendingRollout>(want_step, want_version, std::move(b),
                                                  pj.value("generation_s", 0.0));
}

}  // namespace

std::unique_ptr<Trainer> Trainer::resume(const fs::path& dir, const ResumePlacement& where) {
  const Device device = where.device;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::invalid_argument(fmt::format("--resume: '{}' is not a folder", dir.string()));
  const fs::path meta_path = dir / run_files::kRunMeta;
  if (!fs::is_regular_file(meta_path, ec))
    throw std::invalid_argument(fmt::format(
        "--resume: '{}' is not a run folder (no run_meta.json; lockstep train creates one)",
        dir.string()));
  // Held from here on: a second process resuming (or still running) this run is refused.
  auto lock = std::make_unique<detail::FolderLock>(dir);
  const Json meta = read_json_file(meta_path, "--resume");
  if (meta.value("command", "") != "train" || !meta.contains("options"))
    throw std::invalid_argument(
        fmt::format("--resume: {} was not written by lockstep train (command '{}')",
                    meta_path.string(), meta.value("command", "")));
  const fs::path ck = dir / run_files::kCheckpoint;
  if (!fs::is_regular_file(ck / run_files::kTrainerState, ec) ||
      !fs::is_regular_file(ck / "learner.json", ec))
    throw std::invalid_argument(
        fmt::format("--resume: '{}' has no checkpoint ({} is missing or incomplete)", dir.string(),
                    ck.string()));

  auto m = std::make_unique<Impl>();
  m->dir = dir;
  m->lock = std::move(lock);
  m->opt = options_from_json(meta.at("options"), meta_path.string());
  m->opt.validate();
  if (where.async_rollout && *where.async_rollout != m->opt.async_rollout)
    throw std::invalid_argument(fmt::format(
        "--resume: --async-rollout {} differs from the run's --async-rollout {} ({}): the batches "
        "the run trains on depend on it, so a resumed run keeps it (drop the flag or give {})",
        *where.async_rollout, m->opt.async_rollout, meta_path.string(), m->opt.async_rollout));
  if (!meta.contains("recipe") || !meta["recipe"].contains("content"))
    throw std::invalid_argument(
        fmt::format("--resume: {} has no recipe content", meta_path.string()));
  m->recipe = recipe_from_json(meta["recipe"]["content"], meta_path.string() + ": recipe");
  m->guard = parse_guard(m->opt.guard);
  m->task = &find_task(m->opt.task);
  model::ModelWeights ref;
  try {
    ref = model::load_model_dir((dir / run_files::kReference).string());
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("--resume: the run's reference model: {}", e.what()));
  }

  // The checkpoint must belong to this run: same options, model config and recipe.
  const Json state = read_json_file(ck / run_files::kTrainerState, "--resume");
  if (state.value("options", Json()) != meta.at("options"))
    throw std::invalid_argument(
        fmt::format("--resume: {} was written by a run with other options than {}", ck.string(),
                    meta_path.string()));
  const Json lj = read_json_file(ck / "learner.json", "--resume");
  const model::ModelConfig ck_config =
      model::config_from_json(lj.value("config", Json()), (ck / "learner.json").string());
  if (!(ck_config == ref.config))
    throw std::invalid_argument(
        fmt::format("--resume: checkpoint {} belongs to another model than the run ({}: {})",
                    ck.string(), "checkpoint vs run", config_diff(ck_config, ref.config)));
  const Recipe ck_recipe =
      recipe_from_json(lj.value("recipe", Json()), (ck / "learner.json").string());
  if (to_json(ck_recipe) != to_json(m->recipe))
    throw std::invalid_argument(fmt::format(
        "--resume: checkpoint {} was trained with recipe '{}', the run uses recipe '{}'",
        ck.string(), ck_recipe.name, m->recipe.name));
  const int64_t step = state.value("step", int64_t(-1));
  if (step < 0 || step > m->opt.steps)
    throw std::invalid_argument(fmt::format("--resume: {} has step {} outside [0, {}]",
                                            (ck / run_files::kTrainerState).string(), step,
                                            m->opt.steps));
  const fs::path metrics_path = dir / diag::kMetricsFileName;
  if (step > 0 && !fs::is_regular_file(metrics_path, ec))
    throw std::invalid_argument(fmt::format(
        "--resume: {} is missing (the checkpoint is at step {})", metrics_path.string(), step));
  if (step > 0) check_kept_rows(metrics_path, step);
  m->opt.device = device;
  m->opt.learner_ranks = where.learner_ranks;
  m->opt.sampler_device = where.sampler_device;
  m->opt.validate();  // the rank count against the run's --grad-slots
  std::vector<detail::LearnerReplica> replicas;
  for (const Device& d : learner_devices(m->opt))
    replicas.push_back({model::Learner::load_checkpoint(ck.string(), d), nullptr});
  const model::LearnerConfig want = learner_config(m->opt), &got = replicas[0].learner->config();
  if (got.adamw.lr != want.adamw.lr || got.mode != want.mode ||
      got.temperature != want.temperature || got.seed != want.seed ||
      got.max_grad_norm != want.max_grad_norm ||
      got.adamw.weight_decay != want.adamw.weight_decay || got.kv != want.kv)
    throw std::invalid_argument(fmt::format(
        "--resume: the learner settings in {} (lr, mode, temperature, seed, clipping, weight "
        "decay, K / V rounding) differ from the run's options",
        (ck / "learner.json").string()));
  for (detail::LearnerReplica& rep : replicas)
    rep.reference = reference_decoder(ref, m->recipe, rep.learner->config().device);
  m->ranks = std::make_unique<detail::LearnerRanks>(std::move(replicas), learner_group(m->opt),
                                                    m->opt.grad_slots);
  m->step = step;
  m->elapsed_before_s = state.value("elapsed_s", 0.0);
  m->pending = load_pending_rollout(m->opt, *m->task, step, state, ck);

  // Every check passed: now the folder changes (leftover temporaries, rows after the checkpoint).
  m->lock->record_holder();
  detail::remove_temp_dirs(dir, run_files::kCheckpoint);
  if (fs::exists(metrics_path, ec)) diag::truncate_metrics(metrics_path, step);
  m->metrics.emplace(metrics_path);
  return std::unique_ptr<Trainer>(new Trainer(std::move(m)));
}

void Trainer::Impl::save_checkpoint() {
  // The rows up to this step reach the disk before the checkpoint that says they exist, so a
  // crash never leaves a checkpoint ahead of its rows.
  if (metrics) detail::fsync_file(metrics->path());
  // Replicas that drifted apart would make the checkpoint (rank 0's) a lie about the others.
  ranks->check_replicas();
  // The batch of the next step, sampled by a version this checkpoint does not hold: stored with
  // it, in the same atomic exchange.
  if (pending) pending->wait();
  const fs::path tmp = detail::make_temp_dir(dir, run_files::kCheckpoint);
  try {
    learner().save_checkpoint(tmp.string());
    Json state = {{"format", "lockstep.trainer.v1"},
                  {"step", step},
                  {"policy_version", step},
                  {"optimizer_steps", learner().version()},
                  {"elapsed_s", elapsed_s()},
                  {"options", options_to_json(opt)},
                  {"learner_ranks", opt.learner_ranks}};
    if (opt.async_rollout) {
      state["pending_rollout"] = nullptr;
      if (pending) {
        detail::save_rollout_samples(tmp / run_files::kPendingRollout, pending->wait().samples);
        state["pending_rollout"] = {{"step", pending->step()},
                                    {"policy_version", pending->policy_version()},
                                    {"generation_s", pending->generation_s()},
                                    {"file", run_files::kPendingRollout}};
      }
    }
    write_file_atomic((tmp / run_files::kTrainerState).string(), state.dump(2) + "\n");
    detail::fsync_dir_tree(tmp);
    detail::replace_dir(tmp, dir / run_files::kCheckpoint);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

void Trainer::Impl::write_results(const TrainResult& r) {
  diag::ReportOptions ro;
  ro.title = fmt::format("lockstep train: {}", fs::absolute(dir).filename().string());
  const fs::path runs[] = {dir};
  diag::write_report(runs, dir / run_files::kReport, ro);
  Json meta = read_json_file(dir / run_files::kRunMeta, "run_meta");
  auto opt_num = [](const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); };
  meta["results"] = {{"steps_done", r.steps_done},
                     {"finished", r.finished},
                     {"start_eval_accuracy", opt_num(r.start_eval_accuracy)},
                     {"end_eval_accuracy", opt_num(r.end_eval_accuracy)},
                     {"start_eval_accuracy_bf16", opt_num(r.start_eval_accuracy_bf16)},
                     {"end_eval_accuracy_bf16", opt_num(r.end_eval_accuracy_bf16)},
                     {"elapsed_s", r.elapsed_s},
                     {"policy_version", step},
                     {"report", run_files::kReport}};
  write_file_atomic((dir / run_files::kRunMeta).string(), meta.dump(2) + "\n");
}

}  // namespace lockstep::rl
