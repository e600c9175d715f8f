// placeholder (being written)
#include <gtest/gtest.h>

#include "gpu.h"

TEST(Placeholder, NeedsAGpu) { DDP_REQUIRE_GPUS(1); }
