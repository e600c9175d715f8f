/* Broken: caps has DDP_CAP_OWNS_OPTIMIZER but optimizer_step is NULL. */
#include "stubs.h"

DDP_STRATEGY_ENTRY = {
    STUB_STRATEGY_FIELDS,
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_OWNS_OPTIMIZER,
};
