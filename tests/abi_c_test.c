/* The public ABI must compile as C99 on its own (no C++ types leak in). */
#include <ddp/plugin.h>

/* Descriptors must start with the fields the loader reads before anything
 * else; a compile-time check that they stay first. */
typedef char check_strategy_layout[(offsetof(ddp_strategy_v1_t, abi_version) == 0 &&
                                    offsetof(ddp_strategy_v1_t, struct_size) == 4)
                                       ? 1
                                       : -1];
typedef char check_transport_layout[(offsetof(ddp_transport_v1_t, abi_version) == 0 &&
                                     offsetof(ddp_transport_v1_t, struct_size) == 4)
                                        ? 1
                                        : -1];

int ddp_abi_c_test_version(void) { return (int)DDP_ABI_MAJOR(DDP_ABI_VERSION); }
