/* Broken: a shared library that exports no ddp entry symbol at all. */
#include <ddp/plugin.h>

DDP_PLUGIN_EXPORT int not_a_ddp_plugin(void);
int not_a_ddp_plugin(void) { return 42; }
