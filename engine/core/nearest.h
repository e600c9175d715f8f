// nearest.h — "did you mean": the known name nearest to a misspelt one.
#pragma once

#include <string>
#include <vector>

namespace ddp {

// The name among `names` nearest to `name` (edit distance), if close enough
// to be a typo; else "". Pure.
std::string nearest_name(const std::string& name, const std::vector<std::string>& names);

}  // namespace ddp
