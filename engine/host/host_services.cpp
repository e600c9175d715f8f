// host_services.cpp — HostServices (plugin_host.h): the gradients a
// strategy says final (ddp_host::grads_final, 1.10) for the engine's
// optimizer step. The tables and the storage a strategy claims and binds
// are the store's (param_store.cpp).
#include "plugin_host.h"

#include <algorithm>

#include "whereabouts.h"

namespace ddp {

void HostServices::begin_finals() {
  finals_said = 0;
  final_named.assign(model ? model->params().size() : 0, 0);
}

void HostServices::say_final(Event* done, const size_t* indices, size_t count, const char* label) {
  if (!finals_open)
    throw Error(
        "grads_final: only from on_step_begin of a step's sync micro-batch until its finish returns "
        "(the engine's optimizer step follows)",
        DDP_ERR_INVALID_ARGUMENT);
  for (size_t k = 0; k < count; ++k) {  // all checked before any is taken: a refusal changes nothing
    const Parameter& p = params.param_at("grads_final", indices[k]);
    if (!p.trainable)
      throw Error("grads_final: parameter '" + p.name + "' is frozen: the optimizer steps trainable parameters only",
                  DDP_ERR_INVALID_ARGUMENT);
    if (final_named[indices[k]] || std::count(indices, indices + k, indices[k]))
      throw Error("grads_final: parameter '" + p.name + "' was said final twice this step", DDP_ERR_INVALID_ARGUMENT);
  }
  for (size_t k = 0; k < count; ++k) final_named[indices[k]] = 1;
  if (finals_said == finals.size()) finals.emplace_back();
  FinalGroup& group = finals[finals_said++];  // (kept: nothing allocated once settled)
  group.done = done;
  group.params.assign(indices, indices + count);
  group.label = label;
}

void HostServices::wait_final(size_t k) {
  const FinalGroup& group = finals[k];
  if (!group.done) return;
  const auto start = Clock::now();
  whereabouts::Inside in(group.label, "grads_final");  // a wait the watchdog times
  try {
    group.done->synchronize(wait_limit());
  } catch (const Error& e) {
    throw Error(std::string(group.label) + ": grads_final: " + e.what(), e.status())
        .in_plugin(group.label, "grads_final");
  }
  counters.blocked_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

}  // namespace ddp
