/* Broken: caps has DDP_CAP_OWNS_OPTIMIZER but optimizer_step is NULL. */
#include "stubs.h"

DDP_PLUGIN_EXPORT extern const ddp_strategy_v1_t ddp_strategy_v1;
const ddp_strategy_v1_t ddp_strategy_v1 = {
    STUB_STRATEGY_FIELDS,
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_OPTIMIZER,
};
