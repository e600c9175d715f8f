// config.cpp — TOML configuration: load, apply --set overrides, validate
// against a fixed schema. See config.h for the exact error messages.
#include "config.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

namespace ddp {
namespace {

namespace fs = std::filesystem;

const char* const kSetPrefix = "--set ";

// Every key of the fixed sections. The plugin sections list only `plugin`;
// their other keys belong to the plugin and are checked by PluginSection.
struct KeySpec {
  const char* section;
  const char* key;
  toml::node_type type;
  bool required;
};

constexpr KeySpec kSchema[] = {
    {"run", "world_size", toml::node_type::integer, false},
    {"run", "steps", toml::node_type::integer, true},
    {"run", "seed", toml::node_type::integer, false},
    {"run", "output_dir", toml::node_type::string, false},
    {"run", "timeout_s", toml::node_type::floating_point, false},
    {"run", "log_every", toml::node_type::integer, false},
    {"run", "grad_accum_steps", toml::node_type::integer, false},
    {"run", "threads", toml::node_type::integer, false},
    {"run", "device", toml::node_type::string, false},
    {"run", "share_gpus", toml::node_type::boolean, false},
    {"model", "name", toml::node_type::string, true},
    {"model", "init_from", toml::node_type::string, false},
    {"model", "freeze", toml::node_type::array, false},
    {"model", "preset", toml::node_type::string, false},
    {"model", "vocab_size", toml::node_type::integer, false},
    {"model", "context_length", toml::node_type::integer, false},
    {"model", "d_model", toml::node_type::integer, false},
    {"model", "num_layers", toml::node_type::integer, false},
    {"model", "num_heads", toml::node_type::integer, false},
    {"model", "d_ff", toml::node_type::integer, false},
    {"model", "rope_theta", toml::node_type::floating_point, false},
    {"model", "width", toml::node_type::integer, false},
    {"model", "depth", toml::node_type::integer, false},
    {"model", "classes", toml::node_type::integer, false},
    {"data", "kind", toml::node_type::string, false},
    {"data", "path", toml::node_type::string, false},
    {"data", "batch_size", toml::node_type::integer, true},
    {"optimizer", "name", toml::node_type::string, false},
    {"optimizer", "lr", toml::node_type::floating_point, true},
    {"optimizer", "momentum", toml::node_type::floating_point, false},
    {"optimizer", "betas", toml::node_type::array, false},
    {"optimizer", "eps", toml::node_type::floating_point, false},
    {"optimizer", "weight_decay", toml::node_type::floating_point, false},
    {"optimizer", "groups", toml::node_type::array, false},
    {"schedule", "unfreeze", toml::node_type::array, false},
    {"transport", "plugin", toml::node_type::string, false},
    {"strategy", "plugin", toml::node_type::string, false},
};

bool is_plugin_section(const std::string& section) {
  return section == "transport" || section == "strategy";
}

bool is_known_section(const std::string& section) {
  return std::any_of(std::begin(kSchema), std::end(kSchema),
                     [&](const KeySpec& s) { return section == s.section; });
}

const KeySpec* find_spec(const std::string& section, const std::string& key) {
  for (const KeySpec& s : kSchema)
    if (section == s.section && key == s.key) return &s;
  return nullptr;
}

const char* type_name(toml::node_type type) {
  switch (type) {
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::string: return "a string";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// An integer is an exact float, so it is accepted wherever a float is.
bool has_type(const toml::node& node, toml::node_type type) {
  return node.type() == type ||
         (type == toml::node_type::floating_point && node.is_integer());
}

bool from_override(const toml::source_region& source) {
  return source.path && source.path->rfind(kSetPrefix, 0) == 0;
}

// Values from --set carry their argument as source path (see apply_override).
std::string where_of(const toml::source_region& source, const std::string& file) {
  if (from_override(source)) return *source.path;
  if (source.begin.line == 0) return file;  // built in code, not parsed
  return file + ":" + std::to_string(source.begin.line) + ":" +
         std::to_string(source.begin.column);
}

ConfigError wrong_type(const std::string& where, const std::string& name,
                       toml::node_type expected, const toml::node& node) {
  return ConfigError(where + ": key '" + name + "' must be " + type_name(expected) +
                     ", not " + type_name(node.type()));
}

std::string format_double(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Reads the fixed sections of a parsed document. check_structure() first;
// the typed reads then assume types are right and check value constraints.
class Reader {
 public:
  Reader(const toml::table& doc, const std::string& file) : doc_(doc), file_(file) {}

  void check_structure() const {
    for (auto&& [name, node] : doc_) {
      const std::string section(name.str());
      if (!is_known_section(section)) {
        if (node.is_table()) throw ConfigError(where(node) + ": unknown section '" + section + "'");
        throw ConfigError(where(node) + ": unknown key '" + section + "'");
      }
      if (!node.is_table()) throw wrong_type(where(node), section, toml::node_type::table, node);
      for (auto&& [key_name, value] : *node.as_table()) {
        const std::string key(key_name.str());
        const KeySpec* spec = find_spec(section, key);
        if (!spec) {
          if (is_plugin_section(section)) continue;
          throw ConfigError(where(value) + ": unknown key '" + section + "." + key + "'");
        }
        if (!has_type(value, spec->type))
          throw wrong_type(where(value), section + "." + key, spec->type, value);
      }
    }
    for (const KeySpec& s : kSchema)
      if (s.required && !find(s.section, s.key))
        throw ConfigError(file_ + ": missing required key '" + s.section + "." + s.key + "'");
  }

  int64_t integer(const char* section, const char* key, int64_t fallback, int64_t min,
                  int64_t max = INT64_MAX) const {
    const toml::node* node = find(section, key);
    if (!node) return fallback;
    const int64_t value = node->as_integer()->get();
    require(value >= min, section, key, ">= " + std::to_string(min), std::to_string(value));
    require(value <= max, section, key, "<= " + std::to_string(max), std::to_string(value));
    return value;
  }

  double positive(const char* section, const char* key, double fallback) const {
    const toml::node* node = find(section, key);
    if (!node) return fallback;
    const double value = node->is_integer() ? double(node->as_integer()->get())
                                            : node->as_floating_point()->get();
    require(value > 0, section, key, "> 0", format_double(value));  // also rejects nan
    return value;
  }

  double non_negative(const char* section, const char* key, double fallback) const {
    const toml::node* node = find(section, key);
    if (!node) return fallback;
    const double value = as_double(*node);
    require(value >= 0, section, key, ">= 0", format_double(value));
    return value;
  }

  // optimizer.betas: exactly two floats, each in [0, 1).
  std::pair<double, double> betas(double b1, double b2) const {
    const toml::node* node = find("optimizer", "betas");
    if (!node) return {b1, b2};
    const toml::array& a = *node->as_array();
    bool ok = a.size() == 2;
    for (size_t i = 0; ok && i < 2; ++i) {
      ok = has_type(a[i], toml::node_type::floating_point);
      if (ok) ok = as_double(a[i]) >= 0 && as_double(a[i]) < 1;
    }
    // Floats as format_double writes them elsewhere ("0.9", not TOML++'s
    // full-precision "0.90000000000000002").
    std::ostringstream got;
    got << toml::toml_formatter(a, toml::toml_formatter::default_flags |
                                       toml::format_flags::relaxed_float_precision);
    require(ok, "optimizer", "betas", "two floats in [0, 1)", got.str());
    return {as_double(a[0]), as_double(a[1])};
  }

  // An array of tables ([[section.key]]), each checked against `fields`
  // (name → type, required); calls `read(table, where_prefix)` for each.
  template <typename Read>
  void tables(const char* section, const char* key,
              std::initializer_list<std::tuple<const char*, toml::node_type, bool>> fields, Read read) const {
    const toml::node* node = find(section, key);
    if (!node) return;
    size_t index = 0;
    for (const toml::node& element : *node->as_array()) {
      const std::string name = std::string(section) + "." + key + "[" + std::to_string(index++) + "]";
      if (!element.is_table()) throw wrong_type(where(element), name, toml::node_type::table, element);
      const toml::table& t = *element.as_table();
      for (auto&& [k, v] : t) {
        auto field = std::find_if(fields.begin(), fields.end(),
                                  [&](const auto& f) { return k.str() == std::get<0>(f); });
        if (field == fields.end()) throw ConfigError(where(v) + ": unknown key '" + name + "." + std::string(k.str()) + "'");
        if (!has_type(v, std::get<1>(*field))) throw wrong_type(where(v), name + "." + std::string(k.str()), std::get<1>(*field), v);
      }
      for (const auto& f : fields)
        if (std::get<2>(f) && !t.contains(std::get<0>(f)))
          throw ConfigError(where(element) + ": missing required key '" + name + "." + std::get<0>(f) + "'");
      read(t, name);
    }
  }

  static double as_double(const toml::node& node) {
    return node.is_integer() ? double(node.as_integer()->get()) : node.as_floating_point()->get();
  }

  std::string string(const char* section, const char* key, const std::string& fallback) const {
    const toml::node* node = find(section, key);
    return node ? node->as_string()->get() : fallback;
  }

  bool boolean(const char* section, const char* key, bool fallback) const {
    const toml::node* node = find(section, key);
    return node ? node->as_boolean()->get() : fallback;
  }

  std::string one_of(const char* section, const char* key, const std::string& fallback,
                     const std::vector<std::string>& allowed) const {
    const std::string value = string(section, key, fallback);
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
    require(std::find(allowed.begin(), allowed.end(), value) != allowed.end(), section, key,
            "one of: " + list, "'" + value + "'");
    return value;
  }

  // A path written in the file is relative to the file's directory, so that
  // configs/x.toml can name ../tests/fixtures/...; one given with --set is
  // relative to the working directory, like any command-line path.
  std::string path_from_file(const char* section, const char* key) const {
    const toml::node* node = find(section, key);
    if (!node) return "";
    const fs::path path(node->as_string()->get());
    if (path.is_absolute() || from_override(node->source())) return path.string();
    return (fs::path(file_).parent_path() / path).lexically_normal().string();
  }

  PluginSection plugin_section(const char* section) const {
    static const toml::table empty;
    const toml::table* table = doc_[section].as_table();
    return PluginSection(file_, section, table ? *table : empty);
  }

  const toml::node* find(const char* section, const char* key) const {
    return doc_[section][key].node();
  }

  std::string where(const toml::node& node) const { return where_of(node.source(), file_); }

  void require(bool ok, const char* section, const char* key, const std::string& constraint,
               const std::string& got) const {
    if (ok) return;
    throw ConfigError(where(*find(section, key)) + ": key '" + section + "." + key +
                      "' must be " + constraint + " (got " + got + ")");
  }

 private:
  const toml::table& doc_;
  const std::string& file_;
};

// Letters, digits and '_' '-': what a bare TOML key may hold, so that
// "<key> = <value>" parses as exactly one key.
bool is_bare_key(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-';
  });
}

// A word that may stand for a string without quotes (plugin names, paths).
// It holds no quote or backslash, so quoting it always yields valid TOML.
bool is_bare_word(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || std::string("_-./:+").find(char(c)) != std::string::npos;
  });
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// Parses the value as TOML with "--set <arg>" as source path, so that the
// node reports itself as "--set <arg>" wherever it is later found wrong.
void apply_override(toml::table& doc, const std::string& arg) {
  const std::string source = kSetPrefix + arg;
  const auto eq = arg.find('=');
  const std::string name = trim(arg.substr(0, eq));
  const auto dot = name.find('.');
  const std::string section = name.substr(0, dot);
  const std::string key = dot == std::string::npos ? "" : name.substr(dot + 1);
  if (eq == std::string::npos || !is_bare_key(section) || !is_bare_key(key))
    throw ConfigError(source + ": expected section.key=value");

  const std::string value = trim(arg.substr(eq + 1));
  toml::table parsed;
  try {
    parsed = toml::parse(key + " = " + value, source);
  } catch (const toml::parse_error& e) {
    if (!is_bare_word(value)) throw ConfigError(source + ": " + std::string(e.description()));
    parsed = toml::parse(key + " = \"" + value + "\"", source);
  }

  toml::node* existing = doc.get(section);
  if (!existing) {
    doc.insert(section, std::move(parsed));  // moving keeps the source
  } else if (toml::table* table = existing->as_table()) {
    table->insert_or_assign(key, std::move(*parsed.get(key)));
  }
  // else: the file has a non-table `section`; validation reports it.
}

toml::table parse_file(const std::string& path) {
  std::error_code ec;
  std::ifstream in(path, std::ios::binary);
  if (!in || fs::is_directory(path, ec)) throw ConfigError(path + ": cannot open config file");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    const auto& begin = e.source().begin;
    throw ConfigError(path + ":" + std::to_string(begin.line) + ":" +
                      std::to_string(begin.column) + ": " + std::string(e.description()));
  }
}

}  // namespace

PluginSection::PluginSection(std::string file, std::string section, const toml::table& table)
    : file_(std::move(file)), section_(std::move(section)) {
  for (auto&& [key, node] : table) {
    if (key.str() == "plugin") continue;  // the host's key: which plugin, not its settings
    table_.insert(key, node);
    sources_[std::string(key.str())] = node.source();
  }
}

const toml::node* PluginSection::find(const std::string& key) const {
  read_.insert(key);
  return table_.get(key);
}

std::string PluginSection::where(const std::string& key) const {
  return where_of(sources_.at(key), file_);
}

int64_t PluginSection::get_int(const std::string& key, int64_t fallback) const {
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (!node->is_integer())
    throw wrong_type(where(key), section_ + "." + key, toml::node_type::integer, *node);
  return node->as_integer()->get();
}

double PluginSection::get_float(const std::string& key, double fallback) const {
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (node->is_integer()) return double(node->as_integer()->get());
  if (!node->is_floating_point())
    throw wrong_type(where(key), section_ + "." + key, toml::node_type::floating_point, *node);
  return node->as_floating_point()->get();
}

bool PluginSection::get_bool(const std::string& key, bool fallback) const {
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (!node->is_boolean())
    throw wrong_type(where(key), section_ + "." + key, toml::node_type::boolean, *node);
  return node->as_boolean()->get();
}

std::string PluginSection::get_string(const std::string& key,
                                      const std::string& fallback) const {
  const toml::node* node = find(key);
  if (!node) return fallback;
  if (!node->is_string())
    throw wrong_type(where(key), section_ + "." + key, toml::node_type::string, *node);
  return node->as_string()->get();
}

void PluginSection::check_all_read(const std::string& kind,
                                   const std::string& plugin_name) const {
  // File order; keys from --set come after the file's.
  auto order = [&](const std::string& key) {
    const toml::source_region& s = sources_.at(key);
    return std::make_tuple(from_override(s), s.begin.line, s.begin.column);
  };
  const std::string* first = nullptr;
  for (const auto& entry : sources_) {
    const std::string& key = entry.first;
    if (!read_.count(key) && (!first || order(key) < order(*first))) first = &key;
  }
  if (first)
    throw ConfigError(where(*first) + ": unknown key '" + section_ + "." + *first + "' (" +
                      kind + " plugin '" + plugin_name + "' does not read it)");
}

Config validate_config(const toml::table& doc, const std::string& file) {
  const Reader r(doc, file);
  r.check_structure();

  Config c;
  c.file = file;
  c.run.world_size = int(r.integer("run", "world_size", 1, 1, INT_MAX));
  c.run.steps = r.integer("run", "steps", 0, 0);
  c.run.seed = uint64_t(r.integer("run", "seed", 0, 0));
  // Relative to the working directory: users expect runs/ where they run.
  c.run.output_dir = r.string("run", "output_dir", "runs/" + fs::path(file).stem().string());
  c.run.timeout_s = r.positive("run", "timeout_s", 30.0);
  c.run.log_every = r.integer("run", "log_every", 1, 1);

  c.run.threads = int(r.integer("run", "threads", 1, 1, 1024));
  c.run.device = r.one_of("run", "device", "cpu", {"cpu", "cuda"}) == "cuda" ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
  c.run.share_gpus = r.boolean("run", "share_gpus", false);

  ModelConfig& m = c.model;
  m.name = r.one_of("model", "name", "", {"toy", "toy_tied", "mlp", "lm"});
  m.init_from = r.path_from_file("model", "init_from");
  if (const toml::node* f = r.find("model", "freeze")) {
    for (const toml::node& e : *f->as_array()) {
      if (!e.is_string())
        throw ConfigError(r.where(*f) + ": key 'model.freeze' must be an array of strings (parameter name globs)");
      m.freeze.push_back(e.as_string()->get());
    }
  }
  // Hyper-parameters belong to one model each; elsewhere they are mistakes.
  auto only_for = [&](const char* model, std::initializer_list<const char*> keys) {
    for (const char* key : keys)
      if (m.name != model && r.find("model", key))
        throw ConfigError(r.where(*r.find("model", key)) + ": key 'model." + key + "' applies to model '" + model +
                          "' only");
  };
  only_for("lm", {"preset", "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta"});
  only_for("mlp", {"width", "depth", "classes"});
  m.preset = r.one_of("model", "preset", "lm-tiny", {"lm-tiny", "lm-cpu", "small", "medium", "large", "xl", "2.7B"});
  m.vocab_size = r.integer("model", "vocab_size", 0, 2);
  m.context_length = r.integer("model", "context_length", 0, 1);
  m.d_model = r.integer("model", "d_model", 0, 1);
  m.num_layers = r.integer("model", "num_layers", 0, 1);
  m.num_heads = r.integer("model", "num_heads", 0, 1);
  m.d_ff = r.integer("model", "d_ff", 0, 1);
  m.rope_theta = r.positive("model", "rope_theta", 0.0);
  m.width = r.integer("model", "width", m.width, 1);
  m.depth = r.integer("model", "depth", m.depth, 0);
  m.classes = r.integer("model", "classes", m.classes, 2);

  c.data.path = r.path_from_file("data", "path");
  {
    const std::string inferred = c.data.path.empty() ? "random"
                                 : fs::path(c.data.path).extension() == ".safetensors" ? "safetensors"
                                                                                       : "tokens";
    c.data.kind = r.one_of("data", "kind", inferred, {"random", "safetensors", "tokens"});
    if (c.data.kind == "random" && !c.data.path.empty())
      throw ConfigError(r.where(*r.find("data", "path")) + ": key 'data.path' is not used with data.kind = \"random\"");
    if (c.data.kind != "random" && c.data.path.empty())
      throw ConfigError(file + ": missing required key 'data.path' (data.kind = \"" + c.data.kind + "\")");
    if (c.data.kind == "tokens" && m.name != "lm")
      throw ConfigError(r.where(r.find("data", "kind") ? *r.find("data", "kind") : *r.find("data", "path")) +
                        ": data.kind = \"tokens\" (a token file) needs model 'lm'");
  }
  c.data.batch_size = r.integer("data", "batch_size", 0, 1);
  // The batch is global: every rank takes an equal share.
  if (c.data.batch_size % c.run.world_size != 0)
    throw ConfigError(r.where(*r.find("data", "batch_size")) + ": key 'data.batch_size' (" +
                      std::to_string(c.data.batch_size) +
                      ") must be divisible by run.world_size (" +
                      std::to_string(c.run.world_size) + ")");

  // Plugins see it as ddp_step_info.micro_steps, an int32_t.
  c.run.grad_accum_steps = r.integer("run", "grad_accum_steps", 1, 1, INT_MAX);

  OptimizerConfig& o = c.optimizer;
  o.name = r.one_of("optimizer", "name", "sgd", {"sgd", "adamw"});
  o.lr = r.positive("optimizer", "lr", 0.0);
  o.momentum = r.non_negative("optimizer", "momentum", 0.0);
  std::tie(o.beta1, o.beta2) = r.betas(o.beta1, o.beta2);
  o.eps = r.positive("optimizer", "eps", o.eps);
  o.weight_decay = r.non_negative("optimizer", "weight_decay", o.name == "adamw" ? 0.01 : 0.0);
  for (const char* key : {"momentum"})
    if (o.name != "sgd" && r.find("optimizer", key))
      throw ConfigError(r.where(*r.find("optimizer", key)) + ": key 'optimizer." + key + "' applies to sgd only");
  for (const char* key : {"betas", "eps"})
    if (o.name != "adamw" && r.find("optimizer", key))
      throw ConfigError(r.where(*r.find("optimizer", key)) + ": key 'optimizer." + key + "' applies to adamw only");
  using T = toml::node_type;
  r.tables("optimizer", "groups", {{"params", T::string, true}, {"lr", T::floating_point, false},
                                   {"weight_decay", T::floating_point, false}},
           [&](const toml::table& t, const std::string& name) {
             ParamGroupConfig g;
             g.params = t["params"].value_or(std::string());
             g.lr = t["lr"].node() ? Reader::as_double(*t["lr"].node()) : o.lr;
             g.weight_decay = t["weight_decay"].node() ? Reader::as_double(*t["weight_decay"].node()) : o.weight_decay;
             if (!(g.lr > 0)) throw ConfigError(r.where(*t["lr"].node()) + ": key '" + name + ".lr' must be > 0 (got " + format_double(g.lr) + ")");
             if (!(g.weight_decay >= 0))
               throw ConfigError(r.where(*t["weight_decay"].node()) + ": key '" + name + ".weight_decay' must be >= 0 (got " + format_double(g.weight_decay) + ")");
             o.groups.push_back(g);
           });
  r.tables("schedule", "unfreeze", {{"step", T::integer, true}, {"params", T::string, true}},
           [&](const toml::table& t, const std::string& name) {
             UnfreezeConfig u{t["step"].value_or(int64_t(0)), t["params"].value_or(std::string())};
             if (u.step < 0) throw ConfigError(r.where(*t["step"].node()) + ": key '" + name + ".step' must be >= 0 (got " + std::to_string(u.step) + ")");
             c.unfreeze.push_back(u);
           });

  c.transport_plugin = r.string("transport", "plugin", "gloo");
  c.strategy_plugin = r.string("strategy", "plugin", "naive");
  c.transport = r.plugin_section("transport");
  c.strategy = r.plugin_section("strategy");

  std::ostringstream text;
  text << doc;
  c.toml_text = text.str();
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  toml::table doc = parse_file(path);
  for (const std::string& arg : overrides) apply_override(doc, arg);
  return validate_config(doc, path);
}

PluginSection plugin_section_from_overrides(const std::string& section, const std::vector<std::string>& overrides) {
  toml::table doc;
  for (const std::string& arg : overrides) {
    apply_override(doc, arg);
    const std::string name = trim(arg.substr(0, arg.find('=')));
    if (name.compare(0, section.size() + 1, section + ".") != 0)
      throw ConfigError(kSetPrefix + arg + ": only " + section + ".<key> can be set here");
    if (name == section + ".plugin")
      throw ConfigError(kSetPrefix + arg + ": the " + section + " plugin is not a key here (name it with --" + section + ")");
  }
  const toml::table empty;
  const toml::table* table = doc[section].as_table();
  return PluginSection("", section, table ? *table : empty);
}

}  // namespace ddp
