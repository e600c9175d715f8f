// cpu_host.h — the engine's plugin host (PluginHost) over a CPU device, as a
// plugin sees it, for tests of the host's callbacks: no model; no store
// unless the test sets services.store.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "device.h"
#include "plugin_host.h"

namespace ddp::test {

struct CpuPluginHost {
  explicit CpuPluginHost(const std::string& kind = "transport", const std::vector<std::string>& sets = {})
      : section(plugin_section_from_overrides(kind, sets)) {
    services.device = &device;
    host = std::make_unique<PluginHost>(services, section, kind + " plugin 'test'");
  }
  const ddp_host* get() const { return host->get(); }

  CpuDevice device;
  HostServices services;
  PluginSection section;
  std::unique_ptr<PluginHost> host;
};

}  // namespace ddp::test
