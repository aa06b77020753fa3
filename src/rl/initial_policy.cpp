// The source of a run's initial policy and the warm start before RL
// (include/lockstep/rl/initial_policy.h).
#include "lockstep/rl/initial_policy.h"

#include <fmt/format.h>

#include <stdexcept>

#include "lockstep/model/learner.h"
#include "lockstep/quant/quantize.h"
#include "lockstep/tensor/file_io.h"

namespace lockstep::rl {
namespace fs = std::filesystem;

namespace {

// Errors of the user's model files become std::invalid_argument with their message (which names
// the file and the tensor).
template <class F>
auto as_user_error(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const FileWriteError&) {
    throw;
  } catch (const std::exception& e) {
    throw std::invalid_argument(e.what());
  }
}

void check_finite(const model::ModelWeights& w, const std::string& where) {
  for (const auto& [name, t] : w.tensors)
    if (const int64_t bad = count_nonfinite(to_f32(t)); bad > 0)
      throw std::invalid_argument(fmt::format(
          "{}: weight '{}' {} has {} non-finite value(s) (NaN or Inf); lockstep refuses "
          "non-finite weights",
          where, name, t.describe(), bad));
}

}  // namespace

bool is_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "learner.json", ec);
}

PolicySource open_policy_source(const PolicySourceOptions& o, int64_t min_context) {
  PolicySource s;
  if (o.model_dir.empty()) {
    s.kind = PolicySourceKind::kPreset;
    s.where = "preset " + o.preset;
    s.init_source = "preset:" + o.preset;
    const model::ModelConfig config = as_user_error([&] { return model::preset(o.preset); });
    check_task_model(config, min_context, s.where);
    s.weights = model::init_weights(config, o.init_seed);
    s.meta = {{"source", "preset"}, {"preset", o.preset}, {"init_seed", o.init_seed}};
    return s;
  }
  s.where = o.model_dir;
  s.init_source = "model_dir:" + o.model_dir;
  std::error_code ec;
  if (!fs::is_directory(o.model_dir, ec))
    throw std::invalid_argument(
        fmt::format("{} {}: not a folder (a model directory or a run's checkpoint folder)",
                    o.model_flag, o.model_dir));
  if (is_checkpoint_dir(o.model_dir)) {
    if (!o.allow_checkpoint)
      throw std::invalid_argument(fmt::format(
          "{} {}: compare starts every recipe from one model; give a model directory (a "
          "checkpoint belongs to the recipe it was trained with)",
          o.model_flag, o.model_dir));
    s.kind = PolicySourceKind::kCheckpoint;
    // The one read of the checkpoint: config, recipe and weights come from this load.
    const std::unique_ptr<model::Learner> l =
        as_user_error([&] { return model::Learner::load_checkpoint(o.model_dir); });
    check_task_model(l->weights().config, min_context, o.model_dir);
    s.weights = clone_weights(l->weights());
    s.checkpoint_recipe = l->recipe();
    s.meta = {{"source", "checkpoint"}, {"path", o.model_dir}};
    check_finite(s.weights, o.model_dir);  // a model directory's loader checks its own
  } else {
    s.kind = PolicySourceKind::kModelDir;
    s.weights = as_user_error([&] { return model::load_model_dir(o.model_dir); });
    check_task_model(s.weights.config, min_context, o.model_dir);
    s.meta = {{"source", "model_dir"}, {"path", o.model_dir}};
  }
  return s;
}

void check_source_recipe(const PolicySource& s, const Recipe& recipe) {
  if (!s.checkpoint_recipe || to_json(*s.checkpoint_recipe) == to_json(recipe)) return;
  throw std::invalid_argument(fmt::format(
      "--model {}: the checkpoint was trained with recipe '{}', this run uses '{}' (pass "
      "--recipe {}, or start from a model directory)",
      s.where, s.checkpoint_recipe->name, recipe.name, s.checkpoint_recipe->name));
}

WarmStartPlan plan_warm_start(const PolicySource& s, const WarmStartRequest& r) {
  WarmStartPlan p;
  p.needed = s.kind == PolicySourceKind::kPreset && r.options.steps > 0;
  if (!p.needed) return p;
  const CachedWarmStart c =
      find_cached_warm_start(r.cache_dir, s.weights.config, s.init_source,
                             s.meta.value("init_seed", uint64_t(0)), r.options);
  p.dir = c.dir;
  p.cached = c.present;
  return p;
}

InitialPolicy make_initial_policy(PolicySource&& s, const WarmStartRequest& r,
                                  const std::function<void(const PretrainProgress&)>& on_step) {
  InitialPolicy ip;
  ip.meta["model"] = s.meta;
  if (s.kind != PolicySourceKind::kPreset) {
    ip.weights = std::move(s.weights);
    return ip;
  }
  if (r.options.steps <= 0) {
    ip.weights = std::move(s.weights);
    ip.meta["warm_start"] = nullptr;
    return ip;
  }
  const PretrainOptions& po = r.options;
  WarmStart ws = cached_warm_start(r.cache_dir, s.weights, s.init_source,
                                   s.meta.value("init_seed", uint64_t(0)), po, on_step);
  ip.meta["warm_start"] = {{"cached", ws.cached},
                           {"dir", ws.dir.string()},
                           {"steps", po.steps},
                           {"batch", po.batch},
                           {"lr", po.lr},
                           {"recipe", kPretrainRecipe},
                           {"info", Json::parse(ws.info.dump())}};
  ip.weights = std::move(ws.weights);
  ws.weights = {};
  ip.warm_start = std::move(ws);
  return ip;
}

}  // namespace lockstep::rl
