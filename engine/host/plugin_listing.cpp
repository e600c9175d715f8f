// plugin_listing.cpp — what `ddp plugins` says of each plugin of the search
// path (plugin_loader.h: describe_plugins, format_plugins). Each plugin is
// loaded in a child process of its own (isolated.h): a constructor that
// exits, crashes or hangs is that plugin's refusal, not the listing's end.
#include <sys/stat.h>

#include <iostream>

#include <ddp/numeric.h>
#include <nlohmann/json.hpp>

#include "isolated.h"
#include "plugin_loader.h"

namespace ddp {
namespace {

// A plugin as the child saw it, loaded in-process there.
PluginInfo describe_loaded(PluginKind kind, const std::string& name, const std::string& search_path) {
  PluginInfo info;
  info.kind = kind;
  info.name = name;
  info.path = resolve_plugin_path(kind, name, search_path);
  try {
    const std::unique_ptr<LoadedPlugin> plugin = load_plugin(kind, name, search_path);
    if (const ddp_strategy_v1_t* d = plugin->strategy()) {
      info.version = d->version;
      info.abi_version = d->abi_version;
      info.caps = d->caps;
      info.plans = DDP_PLUGIN_HAS(d, plan);
    } else if (const ddp_transport_v1_t* t = plugin->transport()) {
      info.version = t->version;
      info.abi_version = t->abi_version;
      info.caps = t->caps;
      info.dtypes = ddp_transport_dtypes(t);
      info.plans = DDP_PLUGIN_HAS(t, plan);
    }
    info.keys = declared_keys(*plugin);
  } catch (const PluginError& e) {
    info.refusal = e.what();
  }
  return info;
}

nlohmann::json to_json(const PluginInfo& p) {
  nlohmann::json j = {{"version", p.version}, {"abi", p.abi_version}, {"caps", p.caps},
                      {"refusal", p.refusal}, {"dtypes", p.dtypes},   {"plans", p.plans}};
  if (p.keys) {
    j["keys"] = nlohmann::json::array();
    for (const PluginKey& k : *p.keys) j["keys"].push_back({k.name, k.type, k.help});
  }
  return j;
}

void from_json(const nlohmann::json& j, PluginInfo& p) {
  p.version = j.at("version").get<std::string>();
  p.abi_version = j.at("abi").get<uint32_t>();
  p.caps = j.at("caps").get<uint64_t>();
  p.refusal = j.at("refusal").get<std::string>();
  p.dtypes = j.at("dtypes").get<uint64_t>();
  p.plans = j.at("plans").get<bool>();
  if (!j.contains("keys")) return;
  p.keys.emplace();
  for (const auto& k : j.at("keys")) p.keys->push_back({k.at(0), k.at(1), k.at(2)});
}

}  // namespace

std::vector<PluginInfo> describe_plugins(PluginKind kind, const std::string& search_path,
                                         std::chrono::milliseconds bound) {
  std::vector<PluginInfo> out;
  for (const std::string& name : available_plugins(kind, search_path)) {
    PluginInfo info;
    info.kind = kind;
    info.name = name;
    info.path = resolve_plugin_path(kind, name, search_path);
    try {
      const std::string text =  // its constructors and descriptor, bounded (isolated.h names the plugin)
          run_isolated("", bound, [&] { return to_json(describe_loaded(kind, name, search_path)).dump(); });
      from_json(nlohmann::json::parse(text), info);
    } catch (const Error& e) {  // its code exited, crashed or hung (or no time was left for it)
      const std::string said = e.what();
      const std::string named = std::string(to_string(kind)) + " plugin '" + info.path + "'";
      info.refusal = said.find(info.path) == std::string::npos ? named + ": " + said : said;
      info.misbehaved = true;
    }
    out.push_back(std::move(info));
  }
  for (const std::string& path : irregular_plugin_files(kind, search_path)) {
    PluginInfo info;
    info.kind = kind;
    info.path = path;
    info.name = plugin_name_of(kind, path);
    info.refusal = "'" + path + "' is not a regular file (" + file_type_name(path) + "): skipped";
    info.misbehaved = true;
    out.push_back(std::move(info));
  }
  return out;
}

std::string format_plugins(const std::vector<PluginInfo>& plugins) {
  std::string text;
  for (const PluginInfo& p : plugins) {
    auto padded = [](std::string t, size_t width) { return t.size() < width ? t.append(width - t.size(), ' ') : t; };
    std::string line = padded(to_string(p.kind), 9) + "  " + padded(p.name, 10);
    if (!p.refusal.empty()) {
      text += line + "  cannot load: " + p.refusal + "\n";
      continue;
    }
    line += "  " + p.version + "  ABI " + std::to_string(DDP_ABI_MAJOR(p.abi_version)) + "." +
            std::to_string(DDP_ABI_MINOR(p.abi_version)) + "  ";
    std::string caps;
    if (p.caps & DDP_CAP_DEVICE_CPU) caps += "cpu";
    if (p.caps & DDP_CAP_DEVICE_CUDA) caps += caps.empty() ? "cuda" : ",cuda";
    if (p.caps & DDP_CAP_OWNS_OPTIMIZER) caps += ",owns-optimizer";
    if (p.caps & DDP_CAP_OWNS_GRADIENTS) caps += ",owns-gradients";
    if (p.caps & DDP_CAP_OWNS_PARAMETERS) caps += ",owns-parameters";
    if (p.caps & DDP_CAP_DIVERGENT) caps += ",divergent";
    if (p.caps & DDP_CAP_REDUCE_DTYPE) caps += ",reduce-dtype";
    if (p.plans) caps += ",plans";
    text += line + (caps.empty() ? "-" : caps) + "  " + p.path + "\n";
    if (p.dtypes) {
      std::string dtypes;
      for (int d = DDP_FLOAT32; d <= DDP_FLOAT16; ++d)
        if (p.dtypes & DDP_DTYPE_BIT(d))
          dtypes += (dtypes.empty() ? "" : ", ") + std::string(ddp_dtype_name(ddp_dtype(d)));
      text += "    dtypes: " + dtypes + "\n";
    }
    if (!p.keys) {
      text += "    (keys not declared: checked once the plugin starts)\n";
      continue;
    }
    if (p.keys->empty()) text += "    (no keys)\n";
    for (const PluginKey& k : *p.keys)
      text += "    " + padded(k.name, 18) + "  " + padded(k.type, 16) + "  " + k.help + "\n";
  }
  return text;
}

}  // namespace ddp
