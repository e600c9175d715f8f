/* A minimal valid transport. */
#include "stubs.h"

DDP_PLUGIN_EXPORT extern const ddp_transport_v1_t ddp_transport_v1;
const ddp_transport_v1_t ddp_transport_v1 = {
    STUB_TRANSPORT_FIELDS,
    .name = "valid",
    .version = "0.4.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
};
