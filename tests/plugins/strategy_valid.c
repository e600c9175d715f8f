/* A minimal valid strategy: owns the optimizer step, leaves stats unset. */
#include "stubs.h"

DDP_STRATEGY_ENTRY = {
    STUB_STRATEGY_FIELDS,
    .name = "valid",
    .version = "1.2.3",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_OPTIMIZER,
    .optimizer_step = stub_hook,
};
