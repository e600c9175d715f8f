/* A plugin of a newer major ABI: it exports ddp_strategy_v2 (a new major is
 * a new symbol), which this host does not know. The descriptor's layout is
 * unknown to the host except its leading abi_version. */
#include <ddp/plugin.h>

typedef struct {
  uint32_t abi_version;
  uint32_t struct_size;
  const char* name;
} future_descriptor;

DDP_PLUGIN_EXPORT extern const future_descriptor ddp_strategy_v2;
const future_descriptor ddp_strategy_v2 = {2u << 16 | 3u, sizeof(future_descriptor), "future"};
