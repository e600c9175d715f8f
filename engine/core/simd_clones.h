// simd_clones.h — DDP_SIMD_CLONES, for the CPU's elementwise loops and
// reductions (the model layers, the gradient norm).
#pragma once

// A function so marked is built three times, for x86-64-v4 (AVX-512), for
// x86-64-v3 (AVX2, FMA) and for the baseline, and the loader picks one per
// machine (GCC function multi-versioning): the exp-heavy loops run about
// twice as fast with AVX2 as without, and AVX-512 takes another 20–40 % off
// them where the CPU has full-width units, without requiring either of the
// build. (Vector width changes the order of float reductions written as
// `omp simd reduction`: their results can differ in the last bits between
// machines, never between runs on one.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DDP_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DDP_SIMD_CLONES
#endif
