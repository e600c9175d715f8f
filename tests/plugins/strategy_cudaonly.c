/* Refused at run time: supports CUDA only, so a CPU run must refuse it. */
#include "stubs.h"

DDP_PLUGIN_EXPORT extern const ddp_strategy_v1_t ddp_strategy_v1;
const ddp_strategy_v1_t ddp_strategy_v1 = {
    STUB_STRATEGY_FIELDS,
    .caps = DDP_CAP_DEVICE_CUDA,
};
