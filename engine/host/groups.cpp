// groups.cpp — see groups.h.
#include "groups.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "error.h"

namespace ddp {

GroupPlace place_in_group(const std::vector<int64_t>& colors_and_keys, int parent_rank) {
  const size_t ranks = colors_and_keys.size() / 2;
  if (parent_rank < 0 || size_t(parent_rank) >= ranks)
    throw Error("split: rank " + std::to_string(parent_rank) + " is not in a parent of " + std::to_string(ranks),
                DDP_ERR_INTERNAL);
  for (size_t r = 0; r < ranks; ++r)
    if (colors_and_keys[2 * r] < 0)
      throw Error("split: rank " + std::to_string(r) + " passed color " + std::to_string(colors_and_keys[2 * r]) +
                      ": a color is a number >= 0",
                  DDP_ERR_INVALID_ARGUMENT);
  const int64_t color = colors_and_keys[2 * size_t(parent_rank)];
  GroupPlace place;
  for (size_t r = 0; r < ranks; ++r)
    if (colors_and_keys[2 * r] == color) place.members.push_back(int(r));
  std::stable_sort(place.members.begin(), place.members.end(), [&](int a, int b) {
    return colors_and_keys[2 * size_t(a) + 1] < colors_and_keys[2 * size_t(b) + 1];
  });  // stable: ties keep parent rank order
  place.size = int(place.members.size());
  place.rank = int(std::find(place.members.begin(), place.members.end(), parent_rank) - place.members.begin());
  return place;
}

namespace {

// `text` with every byte outside printable ASCII as \xNN: a name echoed
// in an error prints as what it is.
std::string printable(const char* text) {
  std::string out;
  for (const char* c = text; *c; ++c) {
    const auto byte = static_cast<unsigned char>(*c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += *c;
      continue;
    }
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", byte);
    out += hex;
  }
  return out;
}

}  // namespace

std::string group_name_problem(const char* name) {
  if (!name || !*name) return "a group needs a name";
  const size_t length = std::strlen(name);
  if (length > 31)
    return "group name '" + printable(std::string(name, 31).c_str()) + "...' is longer than 31 characters";
  for (size_t i = 0; i < length; ++i) {
    const char c = name[i];
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return "a group name has only characters of [A-Za-z0-9_.-]: '" + printable(name) + "' has another";
  }
  if (std::string(name) == "world") return "'world' names the world's group: give a group of yours another name";
  return "";
}

std::string group_label(const std::string& name, const std::vector<int>& world_ranks) {
  std::string ranks;
  for (int r : world_ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return "group '" + name + "' (rank" + (world_ranks.size() == 1 ? " " : "s ") + ranks + ")";
}

}  // namespace ddp
