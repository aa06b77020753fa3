// libFuzzer target for the recipe-file reader (parse_recipe_text, what --recipe-file reads): any
// input either gives a valid recipe or throws RecipeError (anything else, or a sanitizer report,
// is a bug); a recipe that parses survives to_json -> recipe_from_json unchanged and resolves
// onto a model without error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "lockstep/recipe/coverage.h"
#include "lockstep/recipe/selection.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  lockstep::Recipe r;
  try {
    r = lockstep::parse_recipe_text(text, "fuzz-input", "fuzz");
  } catch (const lockstep::RecipeError&) {
    return 0;  // a rejected input is fine; any other exception escapes and is reported
  }
  const lockstep::Recipe again = lockstep::recipe_from_json(lockstep::to_json(r), "fuzz-roundtrip");
  if (!(again == r)) std::abort();
  // Depth from the input's size, so the layer rules meet both shallow and deep models.
  const int layers = 1 + int(size % 97);
  const lockstep::ModelPlan plan = lockstep::resolve_model(r, layers);
  if (plan.layers != layers || plan.per_layer.size() != size_t(layers)) std::abort();
  return 0;
}
