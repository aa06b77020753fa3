// parse_json (recipe/json.h): nlohmann's SAX parser feeding a document builder that finds
// repeated keys of large objects through a hash instead of a scan, so parsing stays linear.
#include "lockstep/recipe/json.h"

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace lockstep {
namespace {

// Objects up to this many keys are searched by a scan (cheaper than hashing small objects).
constexpr size_t kScanKeys = 16;

class LinearBuilder {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  explicit LinearBuilder(Json& root) : root_(root) {}

  bool null() { return put(nullptr) != nullptr; }
  bool boolean(bool v) { return put(v) != nullptr; }
  bool number_integer(number_integer_t v) { return put(v) != nullptr; }
  bool number_unsigned(number_unsigned_t v) { return put(v) != nullptr; }
  bool number_float(number_float_t v, const string_t&) { return put(v) != nullptr; }
  bool string(string_t& v) { return put(std::move(v)) != nullptr; }
  bool binary(binary_t& v) { return put(Json::binary(std::move(v))) != nullptr; }

  bool start_object(std::size_t) {
    stack_.push_back({put(Json::object()), nullptr});
    return true;
  }
  bool key(string_t& k) {
    Frame& f = stack_.back();
    // (ordered_map's operator[] looks a key up; positions go through begin()).
    Json::object_t& obj = f.node->get_ref<Json::object_t&>();
    if (!f.keys && obj.size() >= kScanKeys) {
      f.keys = std::make_unique<std::unordered_map<std::string, size_t>>();
      for (size_t i = 0; i < obj.size(); ++i) (*f.keys)[obj.begin()[i].first] = i;
    }
    if (f.keys) {
      auto [it, fresh] = f.keys->emplace(k, obj.size());
      if (!fresh) return slot(&obj.begin()[it->second].second);
    } else {
      for (auto& [existing, value] : obj)
        if (existing == k) return slot(&value);
    }
    obj.emplace_back(std::move(k), nullptr);
    return slot(&obj.back().second);
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    stack_.push_back({put(Json::array()), nullptr});
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;
  }

 private:
  struct Frame {
    Json* node;
    std::unique_ptr<std::unordered_map<std::string, size_t>> keys;  // large objects only
  };

  bool slot(Json* s) {
    slot_ = s;
    return true;
  }
  // Places a value where the document expects the next one: the root, the end of the open array,
  // or the slot of the last key. Pointers into a container stay valid while it is on the stack:
  // only the innermost open container grows.
  Json* put(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json* top = stack_.back().node;
    if (top->is_array()) {
      Json::array_t& a = top->get_ref<Json::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  Json& root_;
  std::vector<Frame> stack_;
  Json* slot_ = nullptr;
};

}  // namespace

Json parse_json(std::string_view text) {
  Json root;
  LinearBuilder builder(root);
  Json::sax_parse(text.begin(), text.end(), &builder);
  return root;
}

void append_new_key(Json& j, const std::string& key, Json value) {
  j.get_ref<Json::object_t&>().emplace_back(key, std::move(value));
}

}  // namespace lockstep
