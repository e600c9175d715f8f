// split_membership.h — a group as the engine computes it before it calls a
// transport's split (ddp/abi/values.h, ddp_split): from every rank's color
// and key, the ranks of the parent that passed this rank's color, ordered
// by key, then by their rank in the parent (MPI_Comm_split's and
// ncclCommSplit's order), and this rank's place among them. The transport
// tests fill ddp_split from it, as the engine does; a pure function with
// its own unit test (transport_test's SplitMembership).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <ddp/plugin.h>

namespace ddp::test {

struct Membership {
  int rank = -1;             // this rank's place in its group
  std::vector<int> members;  // each member's rank in the parent, in group order
  int size() const { return static_cast<int>(members.size()); }
};

// colors[p] and keys[p]: parent rank p's; `me`: this rank in the parent.
inline Membership membership(const std::vector<int>& colors, const std::vector<int>& keys, int me) {
  if (colors.size() != keys.size() || me < 0 || me >= static_cast<int>(colors.size()))
    throw std::invalid_argument("membership: one color and one key per parent rank, and me among them");
  Membership m;
  for (int p = 0; p < static_cast<int>(colors.size()); ++p)
    if (colors[p] == colors[me]) m.members.push_back(p);
  // Stable: equal keys keep the parent's order.
  std::stable_sort(m.members.begin(), m.members.end(), [&](int a, int b) { return keys[a] < keys[b]; });
  m.rank = static_cast<int>(std::find(m.members.begin(), m.members.end(), me) - m.members.begin());
  return m;
}

// The ddp_split for `m`, as the engine fills it; `tag` must outlive it.
inline ddp_split split_request(const Membership& m, int color, int key, const std::string& tag) {
  ddp_split how{};
  how.struct_size = sizeof(ddp_split);
  how.color = color;
  how.key = key;
  how.rank = m.rank;
  how.size = m.size();
  how.tag = tag.c_str();
  return how;
}

}  // namespace ddp::test
