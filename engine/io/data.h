// data.h — the training data one rank sees. Every source is a sequence of
// global rows; micro-batch m (counted over the run) is global rows
// [m*B, (m+1)*B) and rank r takes its contiguous B/N of them, so DDP over N
// ranks sees exactly the rows single-process training sees.
//   random       inputs / labels / token ids of global row g drawn from (run.seed, g)
//   safetensors  x [N, in] with y [N, out] (regression) or y [N] labels
//                (classification); or tokens [N, context+1]; rows in order,
//                wrapping around
//   tokens       a flat little-endian uint16 token file (nanoGPT / llm.c),
//                memory-mapped; global row g is the window of context+1
//                tokens at an offset drawn from (seed, g)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config.h"
#include "model.h"

namespace ddp {

class Dataset {
 public:
  virtual ~Dataset() = default;
  // This rank's rows of micro-batch `micro`, in buffers owned by the
  // dataset (valid until the next call). Throws Error naming the file on
  // bad data.
  virtual Batch batch(int64_t micro) = 0;
  // The rows it reads before it wraps around; -1 where it never does
  // (random rows, token windows).
  virtual int64_t rows() const { return -1; }
};

// Opens the configured source for `rank` of `world`; local rows =
// data.batch_size / world. Throws Error naming the file: missing, empty,
// too short, wrong tensors or shapes.
std::unique_ptr<Dataset> make_dataset(const Config& config, const DataShape& shape, int rank, int world,
                                      Device& device);

// [eval]'s held-out rows (config.h's EvalConfig), batch b = its b-th global
// batch: eval.path's, the rows of data.path set aside (eval.holdout_rows),
// or random data's own stream of rows (its teacher's targets, where
// data.teacher). Throws Error as make_dataset.
std::unique_ptr<Dataset> make_eval_dataset(const Config& config, const DataShape& shape, int rank, int world,
                                           Device& device);

// "" where `batches` of `batch_size` global rows stay within one pass over
// `rows` held-out rows (rounded up to a whole batch; rows < 0: no end);
// else why not, in words. Pure.
std::string eval_batches_beyond(int64_t batches, int64_t batch_size, int64_t rows);

}  // namespace ddp
