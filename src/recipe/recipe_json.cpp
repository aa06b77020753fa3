// Recipe <-> JSON, the schema of docs/recipes.md. Writing is total (every field, so a file
// reproduces the recipe exactly); reading refuses unknown keys and wrong types, naming the field.
#include <fmt/format.h>

#include <limits>
#include <set>

#include "lockstep/recipe/recipe.h"

namespace lockstep {
namespace {

[[noreturn]] void fail(const std::string& where, const std::string& why) {
  throw RecipeError(where + ": " + why);
}

std::string type_of(const Json& j) { return j.type_name(); }

void check_keys(const Json& j, const std::string& where,
                std::initializer_list<std::string_view> ok) {
  if (!j.is_object()) fail(where, "expected a JSON object, got " + type_of(j));
  for (const auto& [k, v] : j.items()) {
    bool found = false;
    for (auto o : ok) found = found || o == k;
    if (!found) {
      std::string list;
      for (auto o : ok) list += (list.empty() ? "" : ", ") + std::string(o);
      fail(where, fmt::format("unknown key '{}' (allowed here: {})", k, list));
    }
  }
}

std::string get_string(const Json& j, const std::string& where) {
  if (!j.is_string()) fail(where, "expected a string, got " + type_of(j));
  return j.get<std::string>();
}
bool get_bool(const Json& j, const std::string& where) {
  if (!j.is_boolean()) fail(where, "expected true or false, got " + type_of(j));
  return j.get<bool>();
}
int get_int(const Json& j, const std::string& where) {
  if (!j.is_number_integer()) fail(where, "expected an integer, got " + j.dump());
  const bool fits = j.is_number_unsigned()
                        ? j.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                        : j.get<int64_t>() >= std::numeric_limits<int>::min() &&
                              j.get<int64_t>() <= std::numeric_limits<int>::max();
  if (!fits) fail(where, fmt::format("{} is outside the range of a layer count", j.dump()));
  return j.get<int>();
}

std::string names_of(auto count, auto name_fn) {
  std::string s;
  for (size_t i = 0; i < size_t(count); ++i)
    s += (s.empty() ? "" : ", ") + std::string(name_fn(decltype(count)(i)));
  return s;
}

// An operand object with "format" starts from that format's defaults (default_spec); without,
// from `base`.
QuantSpec operand_from_json(const Json& j, const QuantSpec& base, const std::string& where) {
  check_keys(j, where,
             {"format", "scaling", "elem", "block2d", "pow2", "eps", "stochastic", "hadamard"});
  QuantSpec op = base;
  if (j.contains("format")) {
    const std::string f = get_string(j["format"], where + ".format");
    auto p = format_from_name(f);
    if (!p)
      fail(where + ".format", fmt::format("unknown format '{}' (known: {})", f,
                                          names_of(Format::kCount, format_name)));
    op = default_spec(*p);
  }
  if (j.contains("scaling")) {
    const std::string s = get_string(j["scaling"], where + ".scaling");
    auto sc = scaling_from_name(s);
    if (!sc)
      fail(where + ".scaling", fmt::format("unknown scaling '{}' (known: {})", s,
                                           names_of(Scaling::kCount, scaling_name)));
    op.scaling = *sc;
  }
  if (j.contains("elem")) {
    const std::string e = get_string(j["elem"], where + ".elem");
    auto codec = elem_codec_from_name(e);
    if (!codec)
      fail(where + ".elem", fmt::format("unknown element codec '{}' (known: {})", e,
                                        names_of(ElemCodec::kCount, elem_codec_name)));
    op.elem = *codec;
  }
  if (j.contains("block2d")) op.block2d = get_bool(j["block2d"], where + ".block2d");
  if (j.contains("pow2")) op.pow2 = get_bool(j["pow2"], where + ".pow2");
  if (j.contains("eps")) {
    const Json& e = j["eps"];
    const double d = e.is_number() ? e.get<double>() : -1.0;
    if (!(d >= 0.0 && d <= double(std::numeric_limits<float>::max())))
      fail(where + ".eps",
           "expected a finite amax floor from 0 to the fp32 maximum, got " + e.dump());
    op.eps = float(d);
    if (d > 0.0 && op.eps == 0.0f)
      fail(where + ".eps", e.dump() + " rounds to 0 in fp32; give 0 or a larger floor");
  }
  if (j.contains("stochastic")) op.stochastic = get_bool(j["stochastic"], where + ".stochastic");
  if (j.contains("hadamard")) op.hadamard = get_bool(j["hadamard"], where + ".hadamard");
  return op;
}

Json coverage_to_json(const Coverage& c) {
  Json j;
  j["scope"] = scope_name(c.scope);
  j["last_fraction_bf16"] = c.last_fraction_bf16;
  j["first_n_bf16"] = c.first_n_bf16;
  j["last_n_bf16"] = c.last_n_bf16;
  j["shared_experts_bf16"] = c.shared_experts_bf16;
  j["exclude_layers"] = c.exclude_layers;
  j["overrides"] = Json::array();
  for (const auto& o : c.overrides) {
    Json oj;
    oj["pattern"] = o.pattern;
    oj["precision"] = o.bf16 ? "bf16" : "quantized";
    for (const auto& [k, v] : o.patch.items()) oj[k] = v;
    j["overrides"].push_back(std::move(oj));
  }
  return j;
}

Coverage coverage_from_json(const Json& j, const std::string& where, const LinearSpec& linear) {
  check_keys(j, where,
             {"scope", "last_fraction_bf16", "first_n_bf16", "last_n_bf16", "shared_experts_bf16",
              "exclude_layers", "overrides"});
  Coverage c;
  if (j.contains("scope")) {
    const std::string s = get_string(j["scope"], where + ".scope");
    auto sc = scope_from_name(s);
    if (!sc)
      fail(where + ".scope", fmt::format("unknown scope '{}' (known: {})", s,
                                         names_of(CoverageScope::kCount, scope_name)));
    c.scope = *sc;
  }
  if (j.contains("last_fraction_bf16")) {
    if (!j["last_fraction_bf16"].is_number())
      fail(where + ".last_fraction_bf16", "expected a number in [0, 1]");
    c.last_fraction_bf16 = j["last_fraction_bf16"].get<double>();
  }
  if (j.contains("first_n_bf16"))
    c.first_n_bf16 = get_int(j["first_n_bf16"], where + ".first_n_bf16");
  if (j.contains("last_n_bf16")) c.last_n_bf16 = get_int(j["last_n_bf16"], where + ".last_n_bf16");
  if (j.contains("shared_experts_bf16"))
    c.shared_experts_bf16 = get_bool(j["shared_experts_bf16"], where + ".shared_experts_bf16");
  if (j.contains("exclude_layers")) {
    const Json& e = j["exclude_layers"];
    if (!e.is_array()) fail(where + ".exclude_layers", "expected an array of layer numbers");
    for (size_t i = 0; i < e.size(); ++i)
      c.exclude_layers.push_back(get_int(e[i], fmt::format("{}.exclude_layers[{}]", where, i)));
  }
  if (j.contains("overrides")) {
    const Json& os = j["overrides"];
    if (!os.is_array()) fail(where + ".overrides", "expected an array of {pattern, precision}");
    for (size_t i = 0; i < os.size(); ++i) {
      const std::string ow = fmt::format("{}.overrides[{}]", where, i);
      check_keys(os[i], ow, {"pattern", "precision", "fprop", "dgrad", "wgrad", "backward_mode"});
      if (!os[i].contains("pattern")) fail(ow, "missing 'pattern'");
      PatternOverride o;
      o.pattern = get_string(os[i]["pattern"], ow + ".pattern");
      const std::string prec =
          os[i].contains("precision") ? get_string(os[i]["precision"], ow + ".precision") : "";
      if (prec != "bf16" && prec != "quantized")
        fail(ow + ".precision", "expected \"bf16\" or \"quantized\"");
      o.bf16 = prec == "bf16";
      o.patch = Json::object();
      for (const auto& [k, v] : os[i].items())
        if (k != "pattern" && k != "precision") o.patch[k] = v;
      if (!o.patch.empty()) linear_from_json(o.patch, linear, ow);  // type-check now
      c.overrides.push_back(std::move(o));
    }
  }
  return c;
}

}  // namespace

// The fields the operand's format takes (format.h), each written; a dense operand is its format.
Json to_json(const QuantSpec& op) {
  Json j;
  j["format"] = format_name(op.format);
  if (!is_quantized(op.format)) return j;
  const Format f = op.format;
  j["scaling"] = scaling_name(op.scaling);
  if (format_info(f).codecs != 0) j["elem"] = elem_codec_name(op.elem);
  if (format_takes(f, kOptBlock2d)) j["block2d"] = op.block2d;
  if (format_takes(f, kOptPow2)) j["pow2"] = op.pow2;
  if (format_takes(f, kOptEps)) j["eps"] = op.eps;
  if (format_takes(f, kOptStochastic)) j["stochastic"] = op.stochastic;
  if (format_takes(f, kOptHadamard)) j["hadamard"] = op.hadamard;
  return j;
}

Json to_json(const LinearSpec& s) {
  Json j;
  for (size_t g = 0; g < size_t(Gemm::kCount); ++g) {
    const auto names = gemm_operand_names(Gemm(g));
    Json gj;
    gj[std::string(names[0])] = to_json(s.gemm[g].a);
    gj[std::string(names[1])] = to_json(s.gemm[g].b);
    j[std::string(gemm_name(Gemm(g)))] = std::move(gj);
  }
  j["backward_mode"] = backward_mode_name(s.backward_mode);
  return j;
}

LinearSpec linear_from_json(const Json& j, const LinearSpec& base, const std::string& where) {
  LinearSpec s = base;
  for (size_t g = 0; g < size_t(Gemm::kCount); ++g) {
    const std::string gn(gemm_name(Gemm(g)));
    if (!j.contains(gn)) continue;
    const auto names = gemm_operand_names(Gemm(g));
    const std::string gw = where + "." + gn;
    check_keys(j[gn], gw, {names[0], names[1]});
    const std::string a(names[0]), b(names[1]);
    if (j[gn].contains(a)) s.gemm[g].a = operand_from_json(j[gn][a], s.gemm[g].a, gw + "." + a);
    if (j[gn].contains(b)) s.gemm[g].b = operand_from_json(j[gn][b], s.gemm[g].b, gw + "." + b);
  }
  if (j.contains("backward_mode")) {
    const std::string m = get_string(j["backward_mode"], where + ".backward_mode");
    auto bm = backward_mode_from_name(m);
    if (!bm)
      fail(where + ".backward_mode",
           fmt::format("unknown backward mode '{}' (known: {})", m,
                       names_of(BackwardMode::kCount, backward_mode_name)));
    s.backward_mode = *bm;
  }
  return s;
}

Json to_json(const Recipe& r) {
  Json j;
  j["name"] = r.name;
  j["purpose"] = r.purpose;
  const Json linear = to_json(r.linear);  // named: items() must not outlive a temporary
  for (const auto& [k, v] : linear.items()) j[k] = v;
  j["modules"] = Json::object();
  for (const auto& [c, s] : r.modules) j["modules"][std::string(module_class_name(c))] = to_json(s);
  j["coverage"] = coverage_to_json(r.coverage);
  return j;
}

Recipe recipe_from_json(const Json& j, const std::string& where) {
  check_keys(
      j, where,
      {"name", "purpose", "fprop", "dgrad", "wgrad", "backward_mode", "modules", "coverage"});
  Recipe r;
  if (!j.contains("name")) fail(where, "missing 'name'");
  r.name = get_string(j["name"], where + ".name");
  if (j.contains("purpose")) r.purpose = get_string(j["purpose"], where + ".purpose");
  r.linear = linear_from_json(j, LinearSpec{}, where);
  if (j.contains("modules")) {
    const Json& m = j["modules"];
    if (!m.is_object()) fail(where + ".modules", "expected an object keyed by module class");
    for (const auto& [k, v] : m.items()) {
      auto c = module_class_from_name(k);
      if (!c)
        fail(where + ".modules", fmt::format("unknown module class '{}' (known: {})", k,
                                             names_of(ModuleClass::kCount, module_class_name)));
      check_keys(v, where + ".modules." + k, {"fprop", "dgrad", "wgrad", "backward_mode"});
      r.modules[*c] = linear_from_json(v, r.linear, where + ".modules." + k);
    }
  }
  if (j.contains("coverage"))
    r.coverage = coverage_from_json(j["coverage"], where + ".coverage", r.linear);
  try {
    validate(r);
  } catch (const RecipeError& e) {
    throw RecipeError(where + ": " + e.what());  // say which file or entry holds the recipe
  }
  // Every field has a default except the forward GEMM's formats: a recipe that does not say them
  // would run everything in bf16 without a word, which is never what a recipe file means.
  if (!j.contains("fprop"))
    fail(
        where,
        "missing 'fprop': give the forward GEMM's operand formats, e.g. \"fprop\": "
        "{\"activation\": "
        "{\"format\": \"mxfp8\"}, \"weight\": {\"format\": \"mxfp8\"}} (bf16 too must be said), or "
        "\"extends\" a built-in recipe");
  return r;
}

}  // namespace lockstep
