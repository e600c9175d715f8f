/* Refused at run time: supports CUDA only, so a CPU run must refuse it. */
#include "stubs.h"

DDP_STRATEGY_ENTRY = {
    STUB_STRATEGY_FIELDS,
    .caps = DDP_CAP_DEVICE_CUDA,
};
