/* Broken: the descriptor's name is NULL. */
#include "stubs.h"

DDP_PLUGIN_EXPORT extern const ddp_transport_v1_t ddp_transport_v1;
const ddp_transport_v1_t ddp_transport_v1 = {
    STUB_TRANSPORT_FIELDS,
    .name = NULL,
};
