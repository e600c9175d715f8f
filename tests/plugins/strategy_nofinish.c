/* Broken: the required entry finish is NULL. */
#include "stubs.h"

DDP_STRATEGY_ENTRY = {
    STUB_STRATEGY_FIELDS,
    .finish = NULL,
};
