// whole_model.cpp — the whole model, read as it is or unit by unit
// (whole_model.h).
#include "whole_model.h"

#include <memory>
#include <utility>

#include "error.h"
#include "safetensors.h"

namespace ddp {

bool values_claimed(const std::vector<Parameter>& params) {
  for (const Parameter& p : params)
    if (p.values_claimed) return true;
  return false;
}

void visit_values(const Model& model, const std::function<void(size_t unit, bool hold)>& unit_values,
                  const std::string& reader, const std::function<void(size_t index)>& visit) {
  const std::vector<Parameter>& params = model.params();
  if (!unit_values) {
    for (size_t i = 0; i < params.size(); ++i) visit(i);
    return;
  }
  const std::vector<Unit>& units = model.units();
  if (units.empty())
    throw Error(reader + " reads every parameter, whose values the strategy claimed, unit by unit, and this model "
                "declares no units", DDP_ERR_UNSUPPORTED);
  for (size_t u = 0; u < units.size(); ++u) {
    unit_values(u, true);
    for (size_t i : units[u].params)
      if (!params[i].data.data())
        throw Error(reader + " reads the values of '" + params[i].name + "', which the strategy claimed and did " +
                    "not bind in unit_values(unit '" + units[u].name + "', 1)", DDP_ERR_INVALID_ARGUMENT);
    for (size_t i : units[u].params) visit(i);
    unit_values(u, false);
  }
}

std::string write_weights(const std::string& path, const std::vector<Parameter>& params, bool writes,
                          bool collective, const HostVisit& visit) {
  if (!writes && !collective) return "";
  std::unique_ptr<SafetensorsWriter> writer;
  std::string failure;
  auto attempt = [&](const auto& f) {
    if (!failure.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  };
  if (writes)
    attempt([&] {
      std::vector<std::pair<std::string, Shape>> names;
      for (const Parameter& p : params) names.emplace_back(p.name, p.shape);
      writer = std::make_unique<SafetensorsWriter>(path, names);
    });
  visit([&](size_t i, const float* values) {
    if (writer) attempt([&] { writer->put(i, values); });
  });
  if (writer) attempt([&] { writer->commit(); });
  return failure;
}

std::vector<std::vector<float>> host_values(const Model& model,
                                            const std::function<void(size_t unit, bool hold)>& unit_values,
                                            const std::string& reader) {
  std::vector<std::vector<float>> out(model.params().size());
  visit_values(model, unit_values, reader, [&](size_t i) { out[i] = model.params()[i].data.to_host(); });
  return out;
}

}  // namespace ddp
