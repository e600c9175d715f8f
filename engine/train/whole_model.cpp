// whole_model.cpp — the whole model, written tensor by tensor
// (whole_model.h).
#include "whole_model.h"

#include <memory>
#include <utility>

#include "error.h"
#include "safetensors.h"

namespace ddp {

std::string write_weights(const std::string& path, const std::vector<Parameter>& params, bool writes, bool collective,
                          const HostVisit& visit) {
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

}  // namespace ddp
