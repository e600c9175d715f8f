// failure.cpp — see failure.h.
#include "failure.h"

#include <nlohmann/json.hpp>

#include "error.h"
#include "whereabouts.h"

namespace ddp {
namespace {

ddp_status kind_from_name(const std::string& name) {
  for (ddp_status s : {DDP_ERR_INVALID_ARGUMENT, DDP_ERR_UNSUPPORTED, DDP_ERR_COMM, DDP_ERR_TIMEOUT,
                       DDP_ERR_OUT_OF_MEMORY, DDP_ERR_INTERNAL})
    if (name == kind_name(s)) return s;
  return DDP_ERR_INTERNAL;
}

}  // namespace

RankFailure failure_of(const std::exception& e, int rank) {
  RankFailure f;
  f.kind = kind_of(e);
  f.rank = rank;
  f.message = e.what();
  if (const auto* error = dynamic_cast<const Error*>(&e)) {
    f.step = error->step();
    f.plugin = error->plugin();
    f.entry = error->entry();
  }
  return f;
}

std::string failure_json(const RankFailure& f) {
  const nlohmann::ordered_json j = {{"kind", kind_name(f.kind)}, {"rank", f.rank},    {"step", f.step},
                                    {"plugin", f.plugin},        {"entry", f.entry},  {"message", f.message},
                                    {"exit_code", f.exit_code},  {"signal", f.signal}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::optional<RankFailure> parse_failure(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  RankFailure f;
  try {
    f.kind = kind_from_name(j.value("kind", ""));
    f.rank = j.value("rank", -1);
    f.step = j.value("step", int64_t(-1));
    f.plugin = j.value("plugin", "");
    f.entry = j.value("entry", "");
    f.message = j.value("message", "");
    f.exit_code = j.value("exit_code", 1);
    f.signal = j.value("signal", 0);
  } catch (const nlohmann::json::exception&) {  // a field of another type
    return std::nullopt;
  }
  return f;
}

bool report_failure(const RankFailure& f) {
  if (!whereabouts::has_channel()) return false;
  const std::string line = "failure " + failure_json(f) + "\n";
  whereabouts::send_line(line.data(), line.size());
  return true;
}

}  // namespace ddp
