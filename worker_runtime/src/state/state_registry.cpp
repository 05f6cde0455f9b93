#include "state/state_registry.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>
#include <algorithm>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>
#include <typeinfo>
#include <unordered_map>
#include <utility>

#include <c10/util/Type.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/json.hpp>

#include "compat/torch_compat.hpp"
#include "gpurun/check.hpp"
#include "state/optimizer_adapter.hpp"
#include "state/state_checksum.hpp"
#include "state/state_registry_impl.hpp"

namespace gpurun::rt {
namespace detail {
namespace {

namespace json = boost::json;

constexpr std::string_view kManifestFormat = "gpurun-state/1";
constexpr size_t kMaxExtensionBytes = size_t{64} << 20;

// ---- encodings used by the manifest -------------------------------------------------------

// Doubles travel as exact hexadecimal text (std::to_chars hex: "1.0624dd2f1a9fcp-10"), so
// they round-trip bit for bit whatever the JSON library's number parsing does.
std::string encode_double(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::hex);
  return std::string(buf, r.ptr);
}

std::optional<double> decode_double(std::string_view s) {
  double v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::hex);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kBase64[(v >> s) & 63]);
  }
  if (const size_t rest = in.size() - i; rest > 0) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (rest == 2) v |= uint8_t(in[i + 1]) << 8;
    out.push_back(kBase64[(v >> 18) & 63]);
    out.push_back(kBase64[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kBase64[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=') : 0;
    if (pad == 1 && in[i + 2] == '=') return std::nullopt;
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const int d = k >= 4 - pad ? 0 : digit(in[i + k]);
      if (d < 0) return std::nullopt;
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out.push_back(static_cast<char>((v >> 16) & 0xff));
    if (pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(v & 0xff));
  }
  return out;
}

// Whether a tensor on `actual` is where the caller asked for `requested` ("cuda" without an
// index means the current device of that type, which a tensor's device always names).
bool on_requested_device(const at::Device& actual, const at::Device& requested) {
  return requested.has_index() ? actual == requested : actual.type() == requested.type();
}

std::string dtype_name(at::ScalarType t) {
  return c10::toString(t);
}

std::optional<at::ScalarType> parse_dtype(std::string_view name) {
  static const at::ScalarType kKnown[] = {
      at::kByte,  at::kChar,   at::kShort,        at::kInt,           at::kLong, at::kHalf,
      at::kFloat, at::kDouble, at::kComplexFloat, at::kComplexDouble, at::kBool, at::kBFloat16,
  };
  for (at::ScalarType t : kKnown) {
    if (name == c10::toString(t)) return t;
  }
  return std::nullopt;
}

// ---- manifest reading: every accessor throws StateError saying where ----------------------

[[noreturn]] void bad_manifest(std::string_view where, std::string_view what) {
  throw StateError(fmt::format("malformed state manifest: {}: {}", where, what));
}

const json::object& as_object(const json::value& v, std::string_view where) {
  if (!v.is_object()) bad_manifest(where, "expected an object");
  return v.get_object();
}

const json::array& as_array(const json::value& v, std::string_view where) {
  if (!v.is_array()) bad_manifest(where, "expected an array");
  return v.get_array();
}

const json::value& member(const json::object& o, std::string_view key, std::string_view where) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr) bad_manifest(where, fmt::format("missing \"{}\"", key));
  return *v;
}

std::string_view string_member(const json::object& o, std::string_view key,
                               std::string_view where) {
  const json::value& v = member(o, key, where);
  if (!v.is_string()) bad_manifest(where, fmt::format("\"{}\" is not a string", key));
  return v.get_string();
}

int64_t int_member(const json::object& o, std::string_view key, std::string_view where) {
  const json::value& v = member(o, key, where);
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= uint64_t(INT64_MAX)) return int64_t(v.get_uint64());
  bad_manifest(where, fmt::format("\"{}\" is not a 64-bit integer", key));
}

double double_member(const json::object& o, std::string_view key, std::string_view where) {
  const auto d = decode_double(string_member(o, key, where));
  if (!d) bad_manifest(where, fmt::format("\"{}\" is not a hexadecimal double", key));
  return *d;
}

std::vector<int64_t> shape_member(const json::object& o, std::string_view where) {
  std::vector<int64_t> shape;
  for (const json::value& d : as_array(member(o, "shape", where), where)) {
    if (!d.is_int64() || d.get_int64() < 0) bad_manifest(where, "bad dimension in \"shape\"");
    shape.push_back(d.get_int64());
  }
  return shape;
}

at::ScalarType dtype_member(const json::object& o, std::string_view where) {
  const std::string_view name = string_member(o, "dtype", where);
  const auto t = parse_dtype(name);
  if (!t) bad_manifest(where, fmt::format("unknown dtype \"{}\"", name));
  return *t;
}

json::array shape_json(c10::IntArrayRef shape) {
  json::array a;
  for (int64_t d : shape) a.emplace_back(d);
  return a;
}

}  // namespace
}  // namespace detail

using namespace detail;  // NOLINT: the .cpp's own helpers

StateRegistry::StateRegistry() : impl_(std::make_unique<Impl>()) {
  install_host_pinner();
}
StateRegistry::~StateRegistry() = default;

bool StateRegistry::empty() const {
  return impl_->modules.empty() && impl_->optimizers.empty() && impl_->scalars.empty() &&
         impl_->extensions.empty();
}

// ---- tracking ------------------------------------------------------------------------------

void StateRegistry::track_module(torch::nn::Module& module, const std::string& prefix) {
  Impl& m = *impl_;
  for (const auto& t : m.modules) {
    if (t.prefix == prefix) {
      throw StateError(fmt::format("a module is already tracked with prefix '{}'", prefix));
    }
  }
  TrackedModule tracked;
  tracked.prefix = prefix;
  auto add = [&](const std::string& local, const at::Tensor& t, bool is_parameter) {
    if (!t.defined()) return;  // e.g. Linear without bias registers an undefined tensor
    tracked.tensors.push_back({prefix.empty() ? local : prefix + "." + local, t, is_parameter,
                               t.sizes().vec(), t.scalar_type()});
  };
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    add(item.key(), item.value(), true);
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    add(item.key(), item.value(), false);
  }
  std::sort(tracked.tensors.begin(), tracked.tensors.end(),
            [](const ModuleTensor& a, const ModuleTensor& b) { return a.name < b.name; });

  // A tensor shared inside the module (weight tying) is tracked once, under its first name;
  // the same tensor under two tracked modules is a mistake.
  std::unordered_map<const c10::TensorImpl*, std::string> added;
  std::vector<ModuleTensor> unique;
  for (auto& t : tracked.tensors) {
    const c10::TensorImpl* impl = t.tensor.unsafeGetTensorImpl();
    if (const auto it = m.names.find(impl); it != m.names.end()) {
      throw StateError(
          fmt::format("'{}' is the same tensor as the already tracked '{}': track each module once",
                      t.name, it->second));
    }
    if (added.emplace(impl, t.name).second) unique.push_back(std::move(t));
  }
  tracked.tensors = std::move(unique);
  for (const auto& [impl, name] : added) m.names.emplace(impl, name);
  m.modules.push_back(std::move(tracked));
}

void StateRegistry::track_optimizer(torch::optim::Optimizer& optimizer, const std::string& name) {
  Impl& m = *impl_;
  for (const auto& o : m.optimizers) {
    if (o.name == name) {
      throw StateError(fmt::format("an optimizer is already tracked with name '{}'", name));
    }
    if (o.optimizer == &optimizer) {
      throw StateError(fmt::format("optimizer '{}' is already tracked as '{}'", name, o.name));
    }
  }
  TrackedOptimizer tracked{name, &optimizer, OptimizerAdapter::for_optimizer(optimizer)};
  (void)m.params_of(tracked);  // every parameter belongs to a tracked module
  m.optimizers.push_back(std::move(tracked));
}

void StateRegistry::track_scalar(const std::string& name, int64_t* value) {
  GPURUN_CHECK(value != nullptr, "track_scalar('{}') with a null pointer", name);
  impl_->check_name_free(name);
  impl_->scalars[name].int_value = value;
}

void StateRegistry::track_scalar(const std::string& name, double* value) {
  GPURUN_CHECK(value != nullptr, "track_scalar('{}') with a null pointer", name);
  impl_->check_name_free(name);
  impl_->scalars[name].double_value = value;
}

void StateRegistry::track_extension(const std::string& name,
                                    std::shared_ptr<StateExtension> extension) {
  GPURUN_CHECK(extension != nullptr, "track_extension('{}') with a null extension", name);
  impl_->check_name_free(name);
  impl_->extensions[name] = std::move(extension);
}

// ---- manifest ------------------------------------------------------------------------------

std::string StateRegistry::manifest() const {
  const Impl& m = *impl_;
  m.check_not_released("manifest()");
  json::object root;
  root["format"] = kManifestFormat;

  json::array modules;
  for (const auto& mod : m.modules) {
    json::array tensors;
    for (const auto& t : mod.tensors) {
      json::object o;
      o["name"] = t.name;
      o["kind"] = t.is_parameter ? "parameter" : "buffer";
      o["dtype"] = dtype_name(t.dtype);
      o["shape"] = shape_json(t.shape);
      tensors.emplace_back(std::move(o));
    }
    json::object o;
    o["prefix"] = mod.prefix;
    o["tensors"] = std::move(tensors);
    modules.emplace_back(std::move(o));
  }
  root["modules"] = std::move(modules);

  json::array optimizers;
  for (const auto& opt : m.optimizers) {
    const OptimizerAdapter& a = *opt.adapter;
    json::array groups;
    for (const auto& group : opt.optimizer->param_groups()) {
      json::array params;
      for (const at::Tensor& p : group.params())
        params.emplace_back(m.names.at(p.unsafeGetTensorImpl()));
      json::object options;
      const std::vector<double> values = a.options(group.options());
      for (size_t i = 0; i < values.size(); ++i)
        options[a.option_names()[i]] = encode_double(values[i]);
      json::object g;
      g["params"] = std::move(params);
      g["options"] = std::move(options);
      groups.emplace_back(std::move(g));
    }
    json::array states;
    for (const auto& [p, name] : m.params_of(opt)) {
      const auto* s = Impl::state_of(opt, p);
      if (s == nullptr) continue;
      Impl::check_state_type(opt, *s, *name);
      json::array fields;
      for (size_t i = 0; i < a.field_names().size(); ++i) {
        const at::Tensor f = a.field(*s, i);
        if (!f.defined()) continue;
        json::object fo;
        fo["field"] = a.field_names()[i];
        fo["dtype"] = dtype_name(f.scalar_type());
        fo["shape"] = shape_json(f.sizes());
        fields.emplace_back(std::move(fo));
      }
      json::object so;
      so["param"] = *name;
      so["step"] = a.step(*s);
      so["fields"] = std::move(fields);
      states.emplace_back(std::move(so));
    }
    json::object o;
    o["name"] = opt.name;
    o["type"] = a.type_name();
    o["groups"] = std::move(groups);
    o["state"] = std::move(states);
    optimizers.emplace_back(std::move(o));
  }
  root["optimizers"] = std::move(optimizers);

  json::array scalars;
  for (const auto& [name, s] : m.scalars) {
    json::object o;
    o["name"] = name;
    o["type"] = s.type();
    if (s.int_value != nullptr) {
      o["value"] = *s.int_value;
    } else {
      o["value"] = encode_double(*s.double_value);
    }
    scalars.emplace_back(std::move(o));
  }
  root["scalars"] = std::move(scalars);

  json::array extensions;
  for (const auto& [name, ext] : m.extensions) {
    const std::string bytes = ext->save();
    if (bytes.size() > kMaxExtensionBytes) {
      throw StateError(fmt::format("state extension '{}' saved {} bytes; the limit is {} bytes",
                                   name, bytes.size(), kMaxExtensionBytes));
    }
    json::object o;
    o["name"] = name;
    o["bytes"] = base64_encode(bytes);
    extensions.emplace_back(std::move(o));
  }
  root["extensions"] = std::move(extensions);
  return json::serialize(root);
}

void StateRegistry::apply_manifest(const std::string& manifest, const at::Device& device) {
  Impl& m = *impl_;
  json::value root_value;
  try {
    root_value = json::parse(manifest);
  } catch (const std::exception& e) {
    throw StateError(fmt::format("malformed state manifest: not JSON ({})", e.what()));
  }
  const json::object& root = as_object(root_value, "top level");
  if (string_member(root, "format", "top level") != kManifestFormat) {
    throw StateError(fmt::format("state manifest has format \"{}\"; this gpurun reads \"{}\"",
                                 string_member(root, "format", "top level"), kManifestFormat));
  }

  // 1. Check everything before changing anything: a mismatch leaves this rank's state intact.
  const json::array& modules = as_array(member(root, "modules", "top level"), "modules");
  if (modules.size() != m.modules.size()) {
    throw StateError(fmt::format("state mismatch: the source tracks {} modules, this rank {}",
                                 modules.size(), m.modules.size()));
  }
  for (size_t i = 0; i < modules.size(); ++i) {
    const TrackedModule& mine = m.modules[i];
    const json::object& mo = as_object(modules[i], "modules");
    const std::string_view prefix = string_member(mo, "prefix", "modules");
    if (prefix != mine.prefix) {
      throw StateError(
          fmt::format("state mismatch: module {} has prefix '{}' in the source but '{}' here", i,
                      prefix, mine.prefix));
    }
    const json::array& tensors = as_array(member(mo, "tensors", mine.prefix), mine.prefix);
    for (size_t k = 0; k < std::max(tensors.size(), mine.tensors.size()); ++k) {
      if (k >= tensors.size() || k >= mine.tensors.size()) {
        throw StateError(fmt::format(
            "state mismatch: module '{}' has {} tensors in the source but {} here; first "
            "unmatched: '{}' ({})",
            mine.prefix, tensors.size(), mine.tensors.size(),
            k < mine.tensors.size() ? mine.tensors[k].name
                                    : std::string(string_member(as_object(tensors[k], mine.prefix),
                                                                "name", mine.prefix)),
            k < mine.tensors.size() ? "only here" : "only in the source"));
      }
      const ModuleTensor& t = mine.tensors[k];
      const json::object& to = as_object(tensors[k], t.name);
      const std::string_view name = string_member(to, "name", t.name);
      if (name != t.name) {
        throw StateError(fmt::format(
            "state mismatch: tensor {} of module '{}' is '{}' in the source but '{}' here", k,
            mine.prefix, name, t.name));
      }
      const auto shape = shape_member(to, t.name);
      const auto dtype = dtype_member(to, t.name);
      const bool is_parameter = string_member(to, "kind", t.name) == "parameter";
      if (shape != t.shape || dtype != t.dtype || is_parameter != t.is_parameter) {
        throw StateError(fmt::format(
            "state mismatch: tensor '{}' is a {} {} {} in the source but a {} {} {} here", t.name,
            dtype_name(dtype), shape_text(shape), is_parameter ? "parameter" : "buffer",
            dtype_name(t.dtype), shape_text(t.shape), t.is_parameter ? "parameter" : "buffer"));
      }
    }
  }

  const json::array& optimizers = as_array(member(root, "optimizers", "top level"), "optimizers");
  if (optimizers.size() != m.optimizers.size()) {
    throw StateError(fmt::format("state mismatch: the source tracks {} optimizers, this rank {}",
                                 optimizers.size(), m.optimizers.size()));
  }
  // Per optimizer: options per group, and the state spec per parameter (nullopt: no state).
  std::vector<std::vector<std::vector<double>>> group_options(m.optimizers.size());
  std::vector<std::vector<std::optional<StateSpec>>> state_specs(m.optimizers.size());
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const TrackedOptimizer& opt = m.optimizers[i];
    const OptimizerAdapter& a = *opt.adapter;
    const json::object& oo = as_object(optimizers[i], "optimizers");
    const std::string_view name = string_member(oo, "name", "optimizers");
    const std::string_view type = string_member(oo, "type", opt.name);
    if (name != opt.name || type != a.type_name()) {
      throw StateError(
          fmt::format("state mismatch: optimizer {} is '{}' ({}) in the source but '{}' ({}) here",
                      i, name, type, opt.name, a.type_name()));
    }
    const json::array& groups = as_array(member(oo, "groups", opt.name), opt.name);
    const auto& my_groups = opt.optimizer->param_groups();
    if (groups.size() != my_groups.size()) {
      throw StateError(fmt::format(
          "state mismatch: optimizer '{}' has {} param groups in the source but {} here", opt.name,
          groups.size(), my_groups.size()));
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::string where = fmt::format("optimizer '{}' param group {}", opt.name, g);
      const json::object& go = as_object(groups[g], where);
      const json::array& params = as_array(member(go, "params", where), where);
      const auto& my_params = my_groups[g].params();
      for (size_t k = 0; k < std::max(params.size(), my_params.size()); ++k) {
        const std::string mine_name =
            k < my_params.size() ? m.names.at(my_params[k].unsafeGetTensorImpl()) : "(none)";
        const std::string theirs = k < params.size() && params[k].is_string()
                                       ? std::string(params[k].get_string())
                                       : "(none)";
        if (mine_name != theirs) {
          throw StateError(
              fmt::format("state mismatch: {} parameter {} is '{}' in the source but '{}' here",
                          where, k, theirs, mine_name));
        }
      }
      const json::object& options = as_object(member(go, "options", where), where);
      std::vector<double> values;
      for (const std::string& option : a.option_names()) {
        values.push_back(double_member(options, option, where));
      }
      group_options[i].push_back(std::move(values));
    }

    const auto params = m.params_of(opt);
    std::unordered_map<std::string_view, size_t> index_of;
    for (size_t k = 0; k < params.size(); ++k) index_of.emplace(*params[k].name, k);
    state_specs[i].resize(params.size());
    for (const json::value& sv : as_array(member(oo, "state", opt.name), opt.name)) {
      const json::object& so = as_object(sv, opt.name);
      const std::string_view param = string_member(so, "param", opt.name);
      const auto it = index_of.find(param);
      if (it == index_of.end()) {
        throw StateError(fmt::format(
            "state mismatch: the source's optimizer '{}' has state for '{}', which it does not "
            "optimize here",
            opt.name, param));
      }
      const std::string where = fmt::format("optimizer '{}' state of '{}'", opt.name, param);
      StateSpec spec;
      spec.step = int_member(so, "step", where);
      spec.fields.resize(a.field_names().size());
      for (const json::value& fv : as_array(member(so, "fields", where), where)) {
        const json::object& fo = as_object(fv, where);
        const std::string_view field = string_member(fo, "field", where);
        const auto& fields = a.field_names();
        const auto f = std::find(fields.begin(), fields.end(), field);
        if (f == fields.end()) {
          throw StateError(fmt::format("state mismatch: {}: {} has no state field '{}'", where,
                                       a.type_name(), field));
        }
        FieldSpec& fs = spec.fields[static_cast<size_t>(f - fields.begin())];
        fs.present = true;
        fs.shape = shape_member(fo, where);
        fs.dtype = dtype_member(fo, where);
      }
      state_specs[i][it->second] = std::move(spec);
    }
  }

  const json::array& scalars = as_array(member(root, "scalars", "top level"), "scalars");
  std::vector<std::pair<Scalar*, const json::object*>> scalar_values;
  for (const json::value& sv : scalars) {
    const json::object& so = as_object(sv, "scalars");
    const std::string name(string_member(so, "name", "scalars"));
    const auto it = m.scalars.find(name);
    const std::string_view type = string_member(so, "type", name);
    if (it == m.scalars.end() || type != it->second.type()) {
      throw StateError(
          fmt::format("state mismatch: the source has {} scalar '{}', this rank {}", type, name,
                      it == m.scalars.end() ? std::string("does not track it")
                                            : fmt::format("tracks it as {}", it->second.type())));
    }
    scalar_values.emplace_back(&it->second, &so);
  }
  if (scalar_values.size() != m.scalars.size()) {
    std::vector<std::string> missing;
    for (const auto& [name, s] : m.scalars) {
      const bool found = std::any_of(scalars.begin(), scalars.end(), [&](const json::value& v) {
        return v.as_object().at("name").as_string() == name;
      });
      if (!found) missing.push_back(name);
    }
    throw StateError(
        fmt::format("state mismatch: this rank tracks scalars the source does not have: {}",
                    fmt::join(missing, ", ")));
  }

  const json::array& extensions = as_array(member(root, "extensions", "top level"), "extensions");
  std::vector<std::pair<StateExtension*, std::string>> extension_bytes;
  for (const json::value& ev : extensions) {
    const json::object& eo = as_object(ev, "extensions");
    const std::string name(string_member(eo, "name", "extensions"));
    const auto it = m.extensions.find(name);
    if (it == m.extensions.end()) {
      throw StateError(fmt::format(
          "state mismatch: the source has extension '{}', which this rank does not track", name));
    }
    auto bytes = base64_decode(string_member(eo, "bytes", name));
    if (!bytes) bad_manifest(name, "\"bytes\" is not base64");
    extension_bytes.emplace_back(it->second.get(), std::move(*bytes));
  }
  if (extension_bytes.size() != m.extensions.size()) {
    std::vector<std::string> missing;
    for (const auto& [name, e] : m.extensions) {
      const bool found = std::any_of(
          extensions.begin(), extensions.end(),
          [&](const json::value& v) { return v.as_object().at("name").as_string() == name; });
      if (!found) missing.push_back(name);
    }
    throw StateError(
        fmt::format("state mismatch: this rank tracks extensions the source does not have: {}",
                    fmt::join(missing, ", ")));
  }

  // 2. Apply. Module tensors: storage of the manifest's (= remembered) shape on `device`.
  torch::NoGradGuard no_grad;
  for (auto& mod : m.modules) {
    for (auto& t : mod.tensors) {
      const bool fits = !m.released && on_requested_device(t.tensor.device(), device) &&
                        t.tensor.sizes() == c10::IntArrayRef(t.shape) &&
                        t.tensor.scalar_type() == t.dtype;
      if (fits) continue;
      t.tensor.set_data(at::empty(t.shape, at::TensorOptions().dtype(t.dtype).device(device)));
      if (t.is_parameter) t.tensor.mutable_grad() = at::Tensor();  // would be on the old device
    }
  }
  m.released = false;

  for (size_t i = 0; i < m.optimizers.size(); ++i) {
    const TrackedOptimizer& opt = m.optimizers[i];
    const OptimizerAdapter& a = *opt.adapter;
    auto& groups = opt.optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g)
      a.set_options(groups[g].options(), group_options[i][g]);

    auto& state = opt.optimizer->state();
    const auto params = m.params_of(opt);
    for (size_t k = 0; k < params.size(); ++k) {
      const at::Tensor& p = params[k].param;
      const auto key = compat::optimizer_state_key(p);
      const auto& spec = state_specs[i][k];
      if (!spec) {
        state.erase(key);
        continue;
      }
      auto& entry = state[key];
      if (!entry || !a.owns(*entry)) entry = a.make_state();
      a.set_step(*entry, spec->step);
      for (size_t f = 0; f < spec->fields.size(); ++f) {
        const FieldSpec& fs = spec->fields[f];
        if (!fs.present) {
          a.set_field(*entry, f, at::Tensor());
          continue;
        }
        const at::Tensor current = a.field(*entry, f);
        const bool fits = current.defined() && on_requested_device(current.device(), device) &&
                          current.sizes() == c10::IntArrayRef(fs.shape) &&
                          current.scalar_type() == fs.dtype && current.is_contiguous();
        if (!fits) {
          a.set_field(*entry, f, m.take_reserved(fs.shape, fs.dtype, device));
        }
      }
    }
  }

  for (auto& [scalar, so] : scalar_values) {
    if (scalar->int_value != nullptr) {
      *scalar->int_value = int_member(*so, "value", "scalar");
    } else {
      *scalar->double_value = double_member(*so, "value", "scalar");
    }
  }
  for (auto& [ext, bytes] : extension_bytes) ext->load(bytes);
  m.receive_reserve.clear();  // what the source's state did not need
}

// ---- tensors, checksum ---------------------------------------------------------------------

std::vector<at::Tensor> StateRegistry::tensors() const {
  const Impl& m = *impl_;
  std::vector<at::Tensor> out;
  if (m.released) return out;
  auto add = [&](const at::Tensor& t, const std::string& name) {
    if (!t.is_contiguous()) {
      throw StateError(fmt::format(
          "tensor '{}' (shape {}, strides {}) is not contiguous: gpurun moves state tensors as "
          "flat buffers",
          name, shape_text(t.sizes()), shape_text(t.strides())));
    }
    out.push_back(t.detach());  // an alias: writes reach the state, autograd stays out of it
  };
  for (const auto& mod : m.modules) {
    for (const auto& t : mod.tensors) add(t.tensor, t.name);
  }
  for (const auto& opt : m.optimizers) {
    const OptimizerAdapter& a = *opt.adapter;
    for (const auto& [p, name] : m.params_of(opt)) {
      const auto* s = Impl::state_of(opt, p);
      if (s == nullptr) continue;
      Impl::check_state_type(opt, *s, *name);
      for (size_t i = 0; i < a.field_names().size(); ++i) {
        const at::Tensor f = a.field(*s, i);
        if (f.defined())
          add(f, fmt::format("{}.state[{}].{}", opt.name, *name, a.field_names()[i]));
      }
    }
  }
  return out;
}

int64_t StateRegistry::nbytes() const {
  int64_t total = 0;
  for (const at::Tensor& t : tensors()) total += static_cast<int64_t>(t.nbytes());
  return total;
}

uint64_t StateRegistry::checksum() const {
  const Impl& m = *impl_;
  m.check_not_released("checksum()");
  StateChecksum sum;
  for (const at::Tensor& t : tensors()) sum.add_tensor(t);
  for (const auto& opt : m.optimizers) {
    const OptimizerAdapter& a = *opt.adapter;
    sum.add(std::string_view(opt.name));
    for (const auto& group : opt.optimizer->param_groups()) {
      for (double v : a.options(group.options())) sum.add(v);
    }
    for (const auto& [p, name] : m.params_of(opt)) {
      const auto* s = Impl::state_of(opt, p);
      sum.add(uint64_t{s != nullptr});
      if (s != nullptr) sum.add(a.step(*s));
    }
  }
  for (const auto& [name, s] : m.scalars) {
    sum.add(std::string_view(name));
    if (s.int_value != nullptr) {
      sum.add(*s.int_value);
    } else {
      sum.add(*s.double_value);
    }
  }
  return sum.finish();
}

// ---- release, materialize ------------------------------------------------------------------

void StateRegistry::release() {
  Impl& m = *impl_;
  bool on_device = false;
  torch::NoGradGuard no_grad;
  for (const auto& opt : m.optimizers) {
    for (const auto& entry : opt.optimizer->state()) {
      const auto* s = entry.second.get();
      if (s == nullptr || !opt.adapter->owns(*s)) continue;
      for (size_t i = 0; i < opt.adapter->field_names().size(); ++i) {
        const at::Tensor f = opt.adapter->field(*s, i);
        on_device = on_device || (f.defined() && !f.is_cpu());
      }
    }
    opt.optimizer->state().clear();
  }
  for (auto& mod : m.modules) {
    for (auto& t : mod.tensors) {
      on_device = on_device || !t.tensor.is_cpu();
      if (t.is_parameter) t.tensor.mutable_grad() = at::Tensor();
      // Same TensorImpl (the optimizer and user code keep theirs), new empty storage.
      t.tensor.set_data(
          at::empty({0}, at::TensorOptions().dtype(t.dtype).device(t.tensor.device())));
    }
  }
  m.released = true;
  if (on_device) compat::release_cached_device_memory();
}

void StateRegistry::materialize(const at::Device& device) {
  Impl& m = *impl_;
  torch::NoGradGuard no_grad;
  for (auto& mod : m.modules) {
    for (auto& t : mod.tensors) {
      const bool fits = !m.released && on_requested_device(t.tensor.device(), device);
      if (fits) continue;
      t.tensor.set_data(at::empty(t.shape, at::TensorOptions().dtype(t.dtype).device(device)));
      if (t.is_parameter) t.tensor.mutable_grad() = at::Tensor();
    }
  }
  m.released = false;
}

}  // namespace gpurun::rt
