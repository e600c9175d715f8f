/* Broken: struct_size stops before the last required entry (barrier). */
#include <stddef.h>

#include "stubs.h"

DDP_PLUGIN_EXPORT extern const ddp_transport_v1_t ddp_transport_v1;
const ddp_transport_v1_t ddp_transport_v1 = {
    STUB_TRANSPORT_FIELDS,
    .struct_size = offsetof(ddp_transport_v1_t, barrier),
};
