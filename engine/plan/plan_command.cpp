// plan_command.cpp — `ddp plan`: the config, as `ddp run` reads it, turned
// into run_plan.h's and mesh.h's inputs; the results as Markdown tables or
// JSON.
#include "plan_command.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "config.h"
#include "config_plan.h"
#include "device.h"
#include "error.h"
#include "fit_check.h"
#include "mesh.h"
#include "plugin_host.h"
#include "plugin_loader.h"
#include "registry.h"
#include "run_plan.h"

namespace ddp {
namespace {

using json = nlohmann::ordered_json;
const char* const kMoments[] = {"after_setup", "before_optimizer_step", "after_optimizer_step"};

// What `ddp run` would say of this host's memory (fit_check.h).
json fit_json(const Config& c) {
  const HostMemory host = host_memory();
  json fit = {{"available_bytes", host.bytes}, {"source", host.source}};
  if (c.run.device != DDP_DEVICE_CPU || host.bytes < 0) {
    fit["verdict"] = c.run.device != DDP_DEVICE_CPU ? "not checked (a GPU run: the device's memory is its limit)"
                                                    : "not checked (this host's available memory is unknown)";
    return fit;
  }
  const std::string refusal = fit_refusal(c, host);
  fit["fits"] = refusal.empty();
  const std::string limit = host.rank_limit < 0 ? ""
                                                : "; " + host.rank_limit_source + " allows each process " +
                                                      std::to_string(host.rank_limit / 1000000) + " MB";
  fit["verdict"] = refusal.empty() ? "fits this host (" + std::to_string(host.bytes / 1000000) + " MB available, " +
                                         host.source + limit + ")"
                                   : refusal.substr(c.file.size() + 2);
  return fit;
}

// o and w: from --overhead, else from the bench file's all_reduce fit at
// this world size (and the config's transport), else none (NaN).
strategy::OverheadFit checked_fit(double o_s, double w, const std::string& where) {
  if (!std::isfinite(o_s) || !(w > 0) || !std::isfinite(w))
    throw Error(where + ": o must be a finite number and w a finite number > 0");
  return {o_s, w};
}

// The all_reduce fit of a bench_comm.json (given as `option`) for the
// config's transport and world; `loaded`: whether it must have been
// measured with --load gemm (a file from before --load was idle).
strategy::OverheadFit fit_from_bench(const std::string& file, const Config& c, const std::string& option, bool loaded) {
  const std::string where = option + " " + file;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) throw Error(where + ": not a file");
  std::ifstream in(file);
  const json doc = json::parse(in, nullptr, false);
  if (doc.is_discarded()) throw Error(where + ": not valid JSON");
  if (!doc.is_object() || !doc.contains("overhead_fit") || !doc["overhead_fit"].is_array())
    throw Error(where + ": not a bench_comm.json (no overhead_fit list)");
  const json& load_field = doc.contains("load") ? doc["load"] : json("none");  // files from before --load: idle
  if (load_field != "none" && load_field != "gemm")
    throw Error(where + ": \"load\" is " + load_field.dump() + ", not \"none\" or \"gemm\"");
  const std::string load = load_field.get<std::string>();
  if (loaded && load == "none")
    throw Error(where + ": measured on idle cores; --bench-busy takes a bench-comm run with --load gemm");
  if (!loaded && load != "none")
    throw Error(where + ": measured with --load " + load + ": give it as --bench-busy, and an idle one as --bench");
  for (const json& f : doc["overhead_fit"]) {
    if (!f.is_object() || f.value("world", 0) != c.run.world_size || f.value("transport", "") != c.transport_plugin)
      continue;
    if (!f.contains("o_s") || !f["o_s"].is_number() || !f.contains("w_bytes_per_s") || !f["w_bytes_per_s"].is_number())
      throw Error(where + ": the fit for '" + c.transport_plugin + "' at world " + std::to_string(c.run.world_size) +
                  " has no numbers o_s and w_bytes_per_s (one size measured?)");
    return checked_fit(f["o_s"].get<double>(), f["w_bytes_per_s"].get<double>(), where);
  }
  throw Error(where + ": no all_reduce fit for transport '" + c.transport_plugin + "' at world " +
              std::to_string(c.run.world_size));
}

// o and w from --overhead or --bench; NaN where neither is given.
strategy::OverheadFit overhead_fit(const PlanOptions& o, const Config& c) {
  if (!o.overhead.empty() && !o.bench_file.empty()) throw Error("--overhead and --bench: give one of them");
  if (!o.bench_busy_file.empty() && o.overhead.empty() && o.bench_file.empty())
    throw Error("--bench-busy prices the collectives beside compute; the others need --bench or --overhead");
  if (!o.overhead.empty()) {
    if (o.overhead.size() != 2) throw Error("--overhead takes two numbers: o in µs, w in GB/s");
    return checked_fit(o.overhead[0] * 1e-6, o.overhead[1] * 1e9, "--overhead");
  }
  if (o.bench_file.empty()) return {NAN, NAN};
  return fit_from_bench(o.bench_file, c, "--bench", false);
}

// The --bench-busy fit; NaN without one.
strategy::OverheadFit busy_fit(const PlanOptions& o, const Config& c) {
  if (o.bench_busy_file.empty()) return {NAN, NAN};
  return fit_from_bench(o.bench_busy_file, c, "--bench-busy", true);
}

json bytes_json(const plan::Bytes& b) {
  json j = json::object();
  int64_t total = 0;
  for (int i = 0; i < DDP_MEM_CATEGORY_COUNT; ++i) {
    j[to_string(static_cast<MemCategory>(i))] = b[static_cast<size_t>(i)];
    total += b[static_cast<size_t>(i)];
  }
  j["total"] = total;
  return j;
}

json run_json(const Config& c, const plan::RunPlan& p, const strategy::OverheadFit& fit,
              const strategy::OverheadFit& busy) {
  json ranks = json::array();
  for (const plan::RankMemory& m : p.ranks)
    ranks.push_back({{kMoments[0], bytes_json(m.after_setup)},
                     {kMoments[1], bytes_json(m.before_optimizer_step)},
                     {kMoments[2], bytes_json(m.after_optimizer_step)}});
  const bool timed = !std::isnan(fit.o_s);
  const strategy::OverheadFit* loaded = std::isnan(busy.o_s) ? nullptr : &busy;
  // The step's collectives as a list with their bytes (and seconds), summed.
  const auto listed = [&](const std::vector<plan::Collective>& list, int64_t* comm, int64_t* bus) {
    json out = json::array();
    *comm = *bus = 0;
    for (const plan::Collective& x : list) {
      json one = {{"op", x.op}, {"bytes", x.bytes}, {"beside_compute", x.beside_compute}};
      if (x.group > 0) one["group_size"] = x.group;  // a group's (1.9)
      if (timed) one["seconds"] = plan::collective_seconds(x, fit, c.run.world_size, loaded);
      out.push_back(one);
      *comm += x.bytes;
      *bus += bus_bytes(x.op.c_str(), x.bytes, x.ranks(c.run.world_size));
    }
    return out;
  };
  int64_t comm = 0;
  int64_t bus = 0;
  const std::vector<plan::Collective> per_step = p.step_collectives();
  const json collectives = listed(per_step, &comm, &bus);
  json j = {{"world_size", c.run.world_size},
            {"strategy", c.strategy_plugin},
            {"transport", c.transport_plugin},
            {"rows_per_rank", c.data.batch_size / c.run.world_size},
            {"peak_bytes", ranks},
            {"collectives_per_step", per_step.size()},
            {"comm_bytes_per_step", comm},
            {"bus_bytes_per_step", bus},
            {"collectives", collectives}};
  if (p.every() > 1) {  // a divergent strategy's sync points: once every `every` steps
    int64_t sync_comm = 0;
    int64_t sync_bus = 0;
    const std::vector<plan::Collective> periodic = p.step_collectives(true);
    j["per_sync_point"] = {{"every", p.every()},
                           {"collectives", listed(periodic, &sync_comm, &sync_bus)},
                           {"comm_bytes", sync_comm},
                           {"bus_bytes", sync_bus}};
    j["mean_comm_bytes_per_step"] = double(comm) + double(sync_comm) / double(p.every());
    j["mean_bus_bytes_per_step"] = double(bus) + double(sync_bus) / double(p.every());
  }
  if (!p.unplanned.empty()) {
    json names = json::array();
    for (const std::string& u : p.unplanned)
      names.push_back(u + " has no plan entry: its collectives and buffers are not planned");
    j["unplanned"] = names;
  }
  if (timed) {
    j["overhead_fit"] = {{"o_s", fit.o_s}, {"w_bytes_per_s", fit.w_bytes_per_s}};
    if (loaded) j["overhead_fit_busy"] = {{"o_s", busy.o_s}, {"w_bytes_per_s", busy.w_bytes_per_s}};
    j["comm_seconds_per_step"] = plan::comm_seconds(per_step, fit, c.run.world_size, loaded);
    if (!std::isfinite(j["comm_seconds_per_step"].get<double>()))
      throw Error("the fit prices the step's collectives beyond any finite time: o or w is out of range");
  }
  return j;
}

// Sets the fields named by KEY=VALUE items (`option` says which flag, in
// errors); VALUE a finite number > 0.
void set_fields(const std::vector<std::string>& items, const std::vector<std::pair<const char*, double*>>& fields,
                const std::string& option) {
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    double* field = nullptr;
    std::string keys;
    for (const auto& [key, f] : fields) {
      if (eq != std::string::npos && item.compare(0, eq, key) == 0 && eq == std::strlen(key)) field = f;
      keys += (keys.empty() ? "" : ", ") + std::string(key);
    }
    if (!field) throw Error(option + " " + item + ": expected KEY=VALUE, KEY one of " + keys);
    const std::string text = item.substr(eq + 1);
    char* end = nullptr;
    *field = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(*field > 0) || !std::isfinite(*field))
      throw Error(option + " " + item + ": VALUE must be a finite number > 0");
  }
}

plan::Precisions precisions(const std::vector<std::string>& items) {
  plan::Precisions p;
  set_fields(items,
             {{"master", &p.master},
              {"gradients", &p.gradients},
              {"optimizer", &p.optimizer},
              {"activations", &p.activations},
              {"comm", &p.comm}},
             "--precision");
  return p;
}

json mesh_json(const PlanOptions& o, const Footprint& f) {
  plan::MeshInput in;
  for (const ParamSize& p : f.params) in.params += static_cast<double>(p.elements);
  in.saved_elements_per_token = f.saved_elements_per_token;
  in.d_model = static_cast<double>(f.d_model);
  in.d_ff = static_cast<double>(f.d_ff);
  in.ffn_matrices = f.ffn_matrices;
  in.tokens = o.tokens;
  if (o.mesh.size() == 2) {
    in.x = o.mesh[0];
    in.y = o.mesh[1];
  } else if (!o.mesh.empty()) {
    throw Error("--mesh takes two numbers: X (FSDP), Y (TP)");
  }
  in.activation_shard = o.activation_shard;
  in.precision = precisions(o.precision);
  try {
    in.hardware = plan::hardware_preset(o.hardware);
  } catch (const std::invalid_argument& e) {
    throw Error(std::string("--hardware: ") + e.what());
  }
  set_fields(o.hardware_set,
             {{"memory", &in.hardware.memory_bytes},
              {"bandwidth", &in.hardware.link_bytes_per_s},
              {"flops", &in.hardware.flops}},
             "--hw");
  if (o.axes.size() == 2) {
    in.hardware.axes_x = o.axes[0];
    in.hardware.axes_y = o.axes[1];
  } else if (!o.axes.empty()) {
    throw Error("--axes takes two numbers: M_X, M_Y");
  }
  plan::MeshPlan m;
  try {
    m = plan::plan_mesh(in);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  const plan::Precisions& pr = in.precision;
  return {{"hardware", in.hardware.name},
          {"memory_per_device", in.hardware.memory_bytes},
          {"W", in.hardware.link_bytes_per_s},
          {"C", in.hardware.flops},
          {"M_X", in.hardware.axes_x},
          {"M_Y", in.hardware.axes_y},
          {"X", in.x},
          {"Y", in.y},
          {"parameters", in.params},
          {"tokens", in.tokens},
          {"tokens_per_device", in.tokens / (double(in.x) * double(in.y))},
          {"ffn_matrices", in.ffn_matrices},
          {"precision",
           {{"master", pr.master},
            {"gradients", pr.gradients},
            {"optimizer", pr.optimizer},
            {"activations", pr.activations},
            {"comm", pr.comm}}},
          {"activation_shard", in.activation_shard},
          {"bytes_per_device",
           {{"master", m.master},
            {"gradients", m.gradients},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"total", m.total}}},
          {"devices_of_memory", m.devices_of_memory},
          {"min_fsdp_to_fit", m.min_x_to_fit},
          {"alpha", m.alpha},
          {"t_math_s", m.t_math},
          {"t_fsdp_s", m.t_fsdp},
          {"t_tp_s", m.t_tp},
          {"fsdp_min_tokens_per_device", m.fsdp_min_tokens_per_device},
          {"fsdp_min_global_tokens", m.fsdp_min_tokens_per_device * double(in.x * in.y)},
          {"tp_max_y", m.tp_max_y},
          {"tp_compute_bound", m.tp_compute_bound},
          {"compute_bound", m.compute_bound}};
}

std::string si(double v, const char* unit) {
  char buf[64];
  const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (std::abs(v) >= 1000.0 && i < 5) {
    v /= 1000.0;
    ++i;
  }
  std::snprintf(buf, sizeof buf, "%.4g %s%s", v, prefixes[i], unit);
  return buf;
}

void print_run(const json& r) {
  std::cout << "\nPeak bytes per rank (summary.json's peak_bytes; optimizer state from the first update on):\n\n"
            << "| rank | moment | parameters | gradients | optimizer_state | comm_buffers | activations | total |\n"
            << "|---|---|---|---|---|---|---|---|\n";
  for (size_t rank = 0; rank < r["peak_bytes"].size(); ++rank)
    for (const char* moment : kMoments) {
      const json& b = r["peak_bytes"][rank][moment];
      std::cout << "| " << rank << " | " << moment;
      for (const char* k : {"parameters", "gradients", "optimizer_state", "comm_buffers", "activations", "total"})
        std::cout << " | " << b[k].get<int64_t>();
      std::cout << " |\n";
    }
  size_t grouped = 0;  // collectives of a strategy's groups (1.9), metered on their group's size
  for (const json& c : r["collectives"]) grouped += c.contains("group_size") ? 1 : 0;
  std::cout << "\nPer step and rank: " << r["collectives_per_step"].get<size_t>() << " collectives, "
            << si(double(r["comm_bytes_per_step"].get<int64_t>()), "B") << " (bus "
            << si(double(r["bus_bytes_per_step"].get<int64_t>()), "B") << ")";
  if (grouped > 0) std::cout << ", " << grouped << " of them within groups of ranks";
  if (r.contains("per_sync_point")) {
    const json& s = r["per_sync_point"];
    std::cout << "; and every " << s["every"].get<int64_t>() << " steps (the sync points) " << s["collectives"].size()
              << " more, " << si(double(s["comm_bytes"].get<int64_t>()), "B") << " (bus "
              << si(double(s["bus_bytes"].get<int64_t>()), "B") << "): a mean of "
              << si(r["mean_bus_bytes_per_step"].get<double>(), "B") << " bus a step";
  }
  if (r.contains("comm_seconds_per_step")) {
    auto at = [](const json& fit) {
      return "at o = " + si(fit["o_s"].get<double>(), "s") + ", w = " + si(fit["w_bytes_per_s"].get<double>(), "B/s");
    };
    std::cout << ", " << si(r["comm_seconds_per_step"].get<double>(), "s") << " of communication";
    if (!r.contains("overhead_fit_busy")) {
      std::cout << " " << at(r["overhead_fit"]);
    } else {
      size_t beside = 0;
      for (const json& x : r["collectives"]) beside += x["beside_compute"].get<bool>();
      std::cout << ": " << beside << " beside compute " << at(r["overhead_fit_busy"]) << " (measured under load)"
                << (beside == 0 ? ", which prices none of them" : "") << "; " << r["collectives"].size() - beside
                << " alone " << at(r["overhead_fit"]);
    }
  }
  std::cout << "\n";
}

void print_mesh(const json& m) {
  const json& b = m["bytes_per_device"];
  std::cout << "\nMesh " << m["X"].get<int64_t>() << " (FSDP) x " << m["Y"].get<int64_t>() << " (TP) on "
            << m["hardware"].get<std::string>() << ", " << si(m["parameters"].get<double>(), "parameters")
            << ", a batch of " << si(m["tokens"].get<double>(), "tokens") << ":\n\n"
            << "| per device | master | gradients | optimizer | activations | total | devices' worth |\n"
            << "|---|---|---|---|---|---|---|\n| bytes | " << si(b["master"].get<double>(), "B") << " | "
            << si(b["gradients"].get<double>(), "B") << " | " << si(b["optimizer"].get<double>(), "B") << " | "
            << si(b["activations"].get<double>(), "B") << " | " << si(b["total"].get<double>(), "B") << " | "
            << m["devices_of_memory"].get<double>() << " |\n\n";
  const int64_t fit = m["min_fsdp_to_fit"].get<int64_t>();
  const int64_t x = m["X"].get<int64_t>();
  const int64_t y = m["Y"].get<int64_t>();
  std::cout << "Smallest FSDP degree within " << si(m["memory_per_device"].get<double>(), "B")
            << " per device (this TP degree and batch): "
            << (fit > 0 ? std::to_string(fit) : std::string("none (the unsharded activations alone exceed it)"))
            << "\nalpha = C / W = " << m["alpha"].get<double>() << " FLOP per byte\n";
  if (x > 1)
    std::cout << "FSDP (X = " << x << ") is compute-bound from " << m["fsdp_min_tokens_per_device"].get<double>()
              << " tokens per device (" << m["fsdp_min_global_tokens"].get<double>() << " in all)\n";
  if (y > 1)
    std::cout << "TP is compute-bound up to Y = " << m["tp_max_y"].get<double>() << ": at Y = " << y << " it is "
              << (m["tp_compute_bound"].get<bool>() ? "compute-bound" : "communication-bound at any batch") << "\n";
  if (m["tokens"].get<double>() > 0)
    std::cout << "Per block's forward at this batch: T_math " << si(m["t_math_s"].get<double>(), "s") << ", T_FSDP "
              << si(m["t_fsdp_s"].get<double>(), "s") << ", T_TP " << si(m["t_tp_s"].get<double>(), "s") << ": "
              << (m["compute_bound"].get<bool>() ? "compute-bound" : "communication-bound") << "\n";
}

}  // namespace

void plan_command(const PlanOptions& o) {
  const Config c = load_config(o.config_path, o.overrides);
  const Footprint f = config_footprint(c);
  int64_t params = 0;
  for (const ParamSize& p : f.params) params += p.elements;
  json out = {{"config", o.config_path}, {"model", c.model.name}, {"parameters", params}};
  if (!f.plan_only) {
    if (!c.model.freeze.empty() || !c.unfreeze.empty())
      throw ConfigError(c.file + ": model.freeze / [[unfreeze]]: `ddp plan` plans runs that train every parameter");
    try {
      const strategy::OverheadFit fit = overhead_fit(o, c);  // its refusals first
      out["run"] = run_json(c, plan_config(c, f), fit, busy_fit(o, c));
      if (c.run.steps < 2)
        out["run"]["note"] =
            "run.steps < 2: the optimizer state, created by the first update, is not yet held "
            "before the run's only optimizer step";
      out["run"]["fit"] = fit_json(c);
    } catch (const std::invalid_argument& e) {
      throw Error(c.file + ": " + e.what());
    }
  }
  const bool mesh_options = o.hardware != "h100-80gb" || !o.axes.empty() || o.tokens != 0 ||
                            o.activation_shard != 0.5 || !o.precision.empty() || !o.hardware_set.empty();
  if (!f.plan_only && o.mesh.empty() && mesh_options)
    throw Error(
        "--hardware, --hw, --axes, --tokens, --activation-shard and --precision describe a mesh: add --mesh X,Y");
  if (f.plan_only && (!o.overhead.empty() || !o.bench_file.empty() || !o.bench_busy_file.empty()))
    throw Error(
        "--overhead, --bench and --bench-busy time a run's collectives; this model is accounting only (no run)");
  if (f.plan_only || !o.mesh.empty()) {
    if (f.d_model == 0) throw Error("model '" + c.model.name + "': the mesh accounting needs a Transformer");
    out["mesh"] = mesh_json(o, f);
  }
  if (o.json) {
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::cout << "ddp plan: " << o.config_path << ": " << c.model.name << ", " << params << " parameters";
  if (out.contains("run"))
    std::cout << "; " << c.strategy_plugin << " on " << c.run.world_size << " ranks, "
              << out["run"]["rows_per_rank"].get<int64_t>() << " rows per rank per micro-batch, " << c.optimizer.name
              << (c.precision.compute == DDP_FLOAT32 ? ""
                                                     : std::string(", compute ") + compute_name(c.precision.compute))
              << "\n";
  else
    std::cout << " (accounting only)\n";
  if (out.contains("run")) print_run(out["run"]);
  if (out.contains("run") && out["run"].contains("note"))
    std::cout << "Note: " << out["run"]["note"].get<std::string>() << "\n";
  if (out.contains("run")) std::cout << "Fit: " << out["run"]["fit"]["verdict"].get<std::string>() << "\n";
  if (out.contains("run") && out["run"].contains("unplanned"))
    for (const json& u : out["run"]["unplanned"]) std::cout << "Not planned: " << u.get<std::string>() << "\n";
  if (out.contains("mesh")) print_mesh(out["mesh"]);
}

}  // namespace ddp
