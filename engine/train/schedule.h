// schedule.h — what changes from step to step besides the weights: the
// learning rate ([schedule] lr) and gradient clipping
// (optimizer.clip_grad_norm), as CS336's trainer and PyTorch define them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config.h"
#include "grad_span.h"
#include "model.h"
#include "update_rules.h"  // sum_of_squares, the gradients' squares

namespace ddp {

// The learning rate of optimizer step `step` (from 0) for a group whose
// unscheduled lr is `lr`: `lr` when constant; cosine (CS336 assignment 1,
// alpha_max = lr, alpha_min = min_lr): t/T_w·lr while t < T_w, then
// min_lr + ½(1 + cos(π(t − T_w)/(T_c − T_w)))(lr − min_lr) up to T_c, then
// min_lr. Pure.
double scheduled_lr(const LrScheduleConfig& schedule, double lr, int64_t step);

// torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6), at
// most 1. Pure.
double clip_coefficient(double total_norm, double max_norm);

// What a strategy's held_ranges (1.9) promises, checked. Pure.
// The first two spans of one rank that hold the same elements, as a
// sentence naming the parameter (`names`, table order) and the elements;
// "" if none do.
std::string overlapping_spans(std::vector<GradSpan> spans, const std::vector<std::string>& names);
// Each parameter's elements this rank holds, each divided by its replicas:
// summed over the ranks, a parameter's numel where they hold it once.
std::vector<double> held_once(const std::vector<GradSpan>& spans, size_t params);
// `every`: every rank's held_once, rank-major (world × numel.size()). The
// first trainable parameter whose elements the ranks do not hold exactly
// once, as a sentence; "" if they all do.
std::string coverage_problem(const std::vector<double>& every, int world, const std::vector<size_t>& numel,
                             const std::vector<bool>& trainable, const std::vector<std::string>& names);

// Clips the gradients of `held` to a global L2 norm of `max_norm` (0:
// measures only) and returns the norm before clipping. `known` (if given):
// each parameter's sum_of_squares of its gradient where already measured
// (the optimizer's, Optimizer::grad_squares), NaN where not; those whole
// spans are not read again. Where `gather` (some span is held by fewer
// than `world` ranks, on any rank: a strategy's choice, the same on every
// rank), each rank's squares of those spans, each divided by its
// replicas, are added through `all_gather` in rank order, the same bits
// on every rank, then the squares of the spans every rank holds: every
// element counted once. `unscale`: the factor the gradients are at
// ([precision] loss scaling's 1 / scale): the norm returned and clipped to
// is theirs times it, and they are multiplied by it in the clip's pass.
double clip_gradients(const std::vector<GradSpan>& held, bool gather, double max_norm, Device& device, int world,
                      const std::function<void(const std::vector<double>&, std::vector<double>&)>& all_gather,
                      const std::vector<double>* known = nullptr, double unscale = 1.0);

}  // namespace ddp
