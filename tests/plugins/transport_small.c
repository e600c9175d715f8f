/* Broken: struct_size stops before the last required entry (barrier). */
#include <stddef.h>

#include "stubs.h"

DDP_TRANSPORT_ENTRY = {
    STUB_TRANSPORT_FIELDS,
    .struct_size = offsetof(ddp_transport_v1_t, barrier),
};
