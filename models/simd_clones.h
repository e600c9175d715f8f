// simd_clones.h — DDP_SIMD_CLONES, for the CPU layers' elementwise loops.
#pragma once

// The elementwise kernels are built twice, for x86-64-v3 (AVX2, FMA) and
// for the baseline, and the loader picks one per machine (GCC function
// multi-versioning): the exp-heavy loops run about twice as fast with AVX2
// without requiring it of the build. (Vector width changes the order of
// float reductions: results can differ in the last bits between machines,
// never between runs on one.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DDP_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DDP_SIMD_CLONES
#endif
