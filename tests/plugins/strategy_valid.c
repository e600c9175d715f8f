/* A minimal valid strategy: owns the optimizer step, leaves stats unset. */
#include "stubs.h"

DDP_PLUGIN_EXPORT extern const ddp_strategy_v1_t ddp_strategy_v1;
const ddp_strategy_v1_t ddp_strategy_v1 = {
    STUB_STRATEGY_FIELDS,
    .name = "valid",
    .version = "1.2.3",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_OPTIMIZER,
    .optimizer_step = stub_hook,
};
