/* Broken: claims major ABI version 2 under the v1 entry symbol. */
#include "stubs.h"

DDP_PLUGIN_EXPORT extern const ddp_strategy_v1_t ddp_strategy_v1;
const ddp_strategy_v1_t ddp_strategy_v1 = {
    STUB_STRATEGY_FIELDS,
    .abi_version = 2u << 16,
};
