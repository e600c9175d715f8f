/* Valid: built against a newer minor ABI (1.9) whose descriptor has one more
 * entry appended, so struct_size exceeds what the host knows. */
#include "stubs.h"

typedef struct {
  ddp_strategy_v1_t v1_0;
  ddp_status (*future_entry)(ddp_strategy* s);
} strategy_v1_9;

DDP_PLUGIN_EXPORT extern const strategy_v1_9 ddp_strategy_v1;
const strategy_v1_9 ddp_strategy_v1 = {
    .v1_0 = {STUB_STRATEGY_FIELDS, .abi_version = (1u << 16) | 9u,
             .struct_size = sizeof(strategy_v1_9), .name = "newer_minor"},
    .future_entry = stub_hook,
};
