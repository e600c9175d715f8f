// replica_check.h — replicas proven equal, not assumed. Data parallelism
// promises that N ranks hold one model; a strategy that mixes up two
// same-sized collectives, a rank given other data, a nondeterministic
// kernel break that promise silently. Every run.check_replicas_every steps
// and at the end of the run, each rank digests every parameter's bits
// (checking on the way that every value is finite), the ranks exchange
// their digests (one all-gather), and any difference stops the run naming
// the first parameter that differs and the ranks it differs on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace ddp {

// A parameter's 64-bit digest (equal bits, equal digests; one bit flipped,
// another digest) and whether every value is finite. Pure; about a byte a
// cycle, so a check costs a pass over the parameters.
struct Digest {
  uint64_t bits = 0;
  bool finite = true;
};
Digest digest(const float* data, size_t count);

// `all` holds every rank's digests (world × names.size(), rank-major). The
// first parameter on which a rank differs from rank 0, as a sentence naming
// it, the step and the ranks; "" if every rank agrees. Pure.
std::string first_divergence(const std::vector<std::string>& names, const std::vector<int64_t>& all, int world,
                             int64_t step);

// run.check_finite: the message for a loss that is not finite, naming the
// first parameter that is not finite (if any): where it came from.
// `values` holds each parameter's values (`names`, table order); null where
// this rank cannot read the whole model alone (the store's view is
// collective), and then none is searched. Pure.
std::string non_finite_loss(double loss, const std::vector<std::string>& names,
                            const std::vector<std::vector<float>>* values);

}  // namespace ddp
