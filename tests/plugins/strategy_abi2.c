/* Broken: claims major ABI version 2 under the v1 entry symbol. */
#include "stubs.h"

DDP_STRATEGY_ENTRY = {
    STUB_STRATEGY_FIELDS,
    .abi_version = 2u << 16,
};
