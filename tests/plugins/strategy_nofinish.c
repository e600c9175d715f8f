/* Broken: the required entry finish is NULL. */
#include "stubs.h"

DDP_PLUGIN_EXPORT extern const ddp_strategy_v1_t ddp_strategy_v1;
const ddp_strategy_v1_t ddp_strategy_v1 = {
    STUB_STRATEGY_FIELDS,
    .finish = NULL,
};
