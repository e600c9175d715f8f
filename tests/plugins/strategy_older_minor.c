/* Valid: built against ABI 1.1, before held_grads was appended (1.2). Its
 * struct_size stops before held_grads; the field past it holds junk here,
 * as memory past an old descriptor may: the host must not see it. */
#include "stubs.h"

static ddp_status junk_held_grads(ddp_strategy* s, size_t* indices, size_t cap, size_t* count, int* partitioned) {
  (void)s, (void)indices, (void)cap, (void)count, (void)partitioned;
  return DDP_ERR_INTERNAL;
}

DDP_STRATEGY_ENTRY = {
    STUB_STRATEGY_FIELDS,
    .abi_version = (1u << 16) | 1u,
    .struct_size = offsetof(ddp_strategy_v1_t, held_grads),
    .name = "older_minor",
    .held_grads = junk_held_grads,
};
