/* Broken: the descriptor's name is NULL. */
#include "stubs.h"

DDP_TRANSPORT_ENTRY = {
    STUB_TRANSPORT_FIELDS,
    .name = NULL,
};
