/* tools/mpi_allreduce_bench.c — Open MPI's own MPI_Allreduce, timed with
 * the conventions of `ddp bench-comm` (engine/bench/bench_comm.h, nccl-tests'
 * doc/PERFORMANCE.md), so that the mpi transport's overhead over raw MPI is a
 * ratio measured on one machine:
 *   float32, in place, MPI_SUM; each timed iteration follows a barrier and
 *   comes after WARMUP untimed ones; an iteration's time is the mean over
 *   ranks; mean and median over iterations; algbw = S / mean time (GB/s,
 *   1e9 bytes); busbw = algbw * 2(n-1)/n. Sizes are binary (1MB = 2^20).
 *
 * build: mpicc -O2 -o mpi_allreduce_bench tools/mpi_allreduce_bench.c
 * run:   mpirun -np 2 ./mpi_allreduce_bench [SIZE_BYTES ...]   (default 1MB 10MB 100MB)
 * prints one Markdown row per size on rank 0.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* bench-comm's default iterations: 50 for small sizes down to 5 at 1GB. */
static int iterations_for(size_t bytes) {
  if (bytes <= ((size_t)16 << 20)) return 50;
  if (bytes <= ((size_t)256 << 20)) return 20;
  return 5;
}

static void bench(size_t bytes, int rank, int world) {
  const size_t count = bytes / sizeof(float);
  float* buf = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) buf[i] = (float)(rank + 1);
  const int warmup = 5, iters = iterations_for(bytes);
  double* times = malloc((size_t)iters * sizeof(double));
  for (int it = -warmup; it < iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double took = MPI_Wtime() - start, sum = 0;
    MPI_Allreduce(&took, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (it >= 0) times[it] = sum / world;
  }
  if (rank == 0) {
    double mean = 0;
    for (int i = 0; i < iters; ++i) mean += times[i] / iters;
    qsort(times, (size_t)iters, sizeof(double), compare);
    const double median = iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
    const double algbw = (double)(count * sizeof(float)) / mean / 1e9;
    printf("| MPI_Allreduce | %d | %zu | %.1f | %.1f | %.3f | %.3f |\n", world, count * sizeof(float), mean * 1e6,
           median * 1e6, algbw, algbw * 2.0 * (world - 1) / world);
  }
  free(times);
  free(buf);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (rank == 0) {
    printf("| implementation | world | bytes | mean us | median us | algbw GB/s | busbw GB/s |\n");
    printf("|---|---|---|---|---|---|---|\n");
  }
  if (argc > 1) {
    for (int i = 1; i < argc; ++i) bench((size_t)strtoull(argv[i], NULL, 10), rank, world);
  } else {
    const size_t sizes[] = {(size_t)1 << 20, (size_t)10 << 20, (size_t)100 << 20};
    for (int i = 0; i < 3; ++i) bench(sizes[i], rank, world);
  }
  MPI_Finalize();
  return 0;
}
