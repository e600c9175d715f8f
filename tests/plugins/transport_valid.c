/* A minimal valid transport. */
#include "stubs.h"

DDP_TRANSPORT_ENTRY = {
    STUB_TRANSPORT_FIELDS,
    .name = "valid",
    .version = "0.4.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
};
