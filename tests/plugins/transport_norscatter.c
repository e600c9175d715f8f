/* transport_norscatter.c — an ABI 1.4 stub transport without the optional
 * reduce_scatter (NULL since 1.4): a strategy that needs it must refuse by
 * name. One rank only: its collectives do nothing. */
#include "stubs.h"

DDP_TRANSPORT_ENTRY = {STUB_TRANSPORT_FIELDS, .name = "norscatter", .reduce_scatter = NULL};
