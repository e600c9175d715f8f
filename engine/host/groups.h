// groups.h — the process groups a strategy makes (ddp_host::split, ABI
// 1.9), as pure functions: who belongs to which group, whether a name is
// one the engine reports, and how a report names a group. The groups
// themselves (a communicator each, metered) are MeteredTransport's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

// This rank's group of a split: its place, the group's size and its
// members' ranks in the parent communicator, in group order.
struct GroupPlace {
  int rank = -1;
  int size = 0;
  std::vector<int> members;  // parent ranks, in group order
};

// The group of parent rank `parent_rank`, from every parent rank's (color,
// key), two words per rank in parent rank order: the ranks of its color,
// ordered by key, then by parent rank (MPI_Comm_split's order). Throws
// Error naming the first rank whose color is negative. Pure.
GroupPlace place_in_group(const std::vector<int64_t>& colors_and_keys, int parent_rank);

// Why `name` is no group name ("" if it is one): 1 to 31 characters of
// [A-Za-z0-9_.-], not "world" (the world's). Pure.
std::string group_name_problem(const char* name);

// "group 'replicate' (ranks 1, 3)": a group as reports name it. Pure.
std::string group_label(const std::string& name, const std::vector<int>& world_ranks);

}  // namespace ddp
