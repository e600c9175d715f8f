/* ddp/abi/values.h — part of ddp/plugin.h: the values and types every other
 * part uses. Version numbers and entry symbols, statuses, dtypes, devices,
 * memory categories, capability bits, and the plain structs that cross the
 * boundary by pointer (buffers, parameters, units, element ranges). C99,
 * compiles alone; include ddp/plugin.h rather than this part.
 *
 * Structs passed by pointer one at a time (ddp_buffer, ddp_param, ddp_unit,
 * ddp_step_info) may grow at the end in a minor version. Use only the
 * fields you know, never copy them into arrays of your own, and read a
 * field added in minor m only where the engine is of minor m or newer:
 * DDP_ABI_MINOR(host->abi_version) >= m. ddp_range crosses as an array and
 * never grows: a later minor that needs more gives a struct of its own. */
#ifndef DDP_ABI_VALUES_H
#define DDP_ABI_VALUES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_ABI_VERSION_MAJOR 1
#define DDP_ABI_VERSION_MINOR 12
/* abi_version = major << 16 | minor. */
#define DDP_ABI_VERSION ((uint32_t)((DDP_ABI_VERSION_MAJOR << 16) | DDP_ABI_VERSION_MINOR))
#define DDP_ABI_MAJOR(v) ((uint32_t)(v) >> 16)
#define DDP_ABI_MINOR(v) ((uint32_t)(v)&0xffffu)

/* Entry symbol names, for hosts that look them up (DDP_*_ENTRY in
 * ddp/abi/strategy.h and ddp/abi/transport.h define them). */
#define DDP_TRANSPORT_ENTRY_V1 "ddp_transport_v1"
#define DDP_STRATEGY_ENTRY_V1 "ddp_strategy_v1"

#if defined(_WIN32)
#define DDP_PLUGIN_EXPORT __declspec(dllexport)
#else
#define DDP_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

typedef enum ddp_status {
  DDP_OK = 0,
  DDP_ERR_INVALID_ARGUMENT = 1, /* bad key, bad buffer, bad index */
  DDP_ERR_UNSUPPORTED = 2,      /* dtype, device or entry not supported */
  DDP_ERR_COMM = 3,             /* a peer failed or the network did */
  DDP_ERR_TIMEOUT = 4,          /* timeout_s elapsed */
  DDP_ERR_OUT_OF_MEMORY = 5,
  DDP_ERR_INTERNAL = 6
} ddp_status;

typedef enum ddp_dtype {
  DDP_FLOAT32 = 0,
  DDP_FLOAT64 = 1,
  DDP_INT32 = 2,
  DDP_INT64 = 3,
  DDP_BFLOAT16 = 4,
  DDP_FLOAT16 = 5
} ddp_dtype;

/* Bytes per element of `dtype`; 0 for a value this header does not name. */
static inline size_t ddp_dtype_size(ddp_dtype dtype) {
  switch (dtype) {
    case DDP_FLOAT32:
    case DDP_INT32: return 4;
    case DDP_FLOAT64:
    case DDP_INT64: return 8;
    case DDP_BFLOAT16:
    case DDP_FLOAT16: return 2;
  }
  return 0;
}
/* A set of dtypes, as a transport's `dtypes` holds it. */
#define DDP_DTYPE_BIT(dtype) (UINT64_C(1) << (dtype))

/* One TOML key of a plugin, for `ddp plugins` and for the launcher, which
 * refuses a key of the plugin's table that no entry names before any rank
 * starts. An array of them ends with an entry whose name is NULL. */
typedef struct ddp_key {
  const char* name;
  const char* type; /* "int", "float", "bool", "string", or as it reads: "float or \"auto\"" */
  const char* help; /* one line, with the default */
} ddp_key;

typedef enum ddp_device_kind { DDP_DEVICE_CPU = 0, DDP_DEVICE_CUDA = 1 } ddp_device_kind;
typedef enum ddp_reduce_op { DDP_REDUCE_SUM = 0, DDP_REDUCE_AVG = 1 /* sum / world_size */ } ddp_reduce_op;
typedef enum ddp_log_level { DDP_LOG_DEBUG = 0, DDP_LOG_INFO = 1, DDP_LOG_WARN = 2, DDP_LOG_ERROR = 3 } ddp_log_level;

/* Memory categories of the engine's accounting (current and peak bytes).
 * Memory counts where its owner puts it: a strategy's shard of the
 * gradients under DDP_MEM_GRADIENTS, its staging under COMM_BUFFERS. */
typedef enum ddp_mem_category {
  DDP_MEM_PARAMETERS = 0,
  DDP_MEM_GRADIENTS = 1,
  DDP_MEM_OPTIMIZER_STATE = 2,
  DDP_MEM_COMM_BUFFERS = 3,
  DDP_MEM_ACTIVATIONS = 4,
  DDP_MEM_CATEGORY_COUNT = 5
} ddp_mem_category;

/* Capability bits of a descriptor's `caps`. */
#define DDP_CAP_DEVICE_CPU (1u << 0)       /* works on CPU memory */
#define DDP_CAP_DEVICE_CUDA (1u << 1)      /* works on CUDA memory */
#define DDP_CAP_OWNS_OPTIMIZER (1u << 8)   /* strategy: implements optimizer_step */
#define DDP_CAP_OWNS_GRADIENTS (1u << 9)   /* strategy (1.4): may claim gradient storage (ddp_host::claim) */
#define DDP_CAP_OWNS_PARAMETERS (1u << 10) /* strategy (1.5): may claim parameter storage (DDP_STORAGE_DATA) */
#define DDP_CAP_DIVERGENT (1u << 11)       /* strategy (1.8): replicas may differ between sync points (on_step_end) */
#define DDP_CAP_REDUCE_DTYPE (1u << 12)    /* strategy (1.11): reduces gradients in ddp_precision::reduce */

/* A contiguous buffer on the run's device; `count` in elements. Passed by
 * pointer, read during the call only (the memory it names must stay valid
 * until the enqueued work completes). */
typedef struct ddp_buffer {
  void* ptr;
  size_t count;
  ddp_dtype dtype;
  ddp_device_kind device;
} ddp_buffer;

/* "No unit": the unit of a parameter where the model declares none. */
#define DDP_NO_UNIT ((size_t)-1)

/* One model parameter, in the model's named_parameters() order: `numel`
 * elements of `dtype` on the run's device, row-major. The host owns the
 * entry; reach it through host->param(ctx, i) only. `data` and `grad` are
 * where the values and the gradient are now: `grad` is NULL while the
 * parameter is frozen; for a parameter whose gradient storage the strategy
 * claimed (ddp_host::claim), while no storage is bound to it; and, for a
 * strategy whose caps have DDP_CAP_OWNS_GRADIENTS, in create (the engine
 * makes the gradients it holds after create, once it knows which are
 * claimed) and, for a parameter just unfrozen, in that step's first
 * on_step_begin. `data` is NULL (1.5) for a parameter whose values the
 * strategy claimed, from the end of on_train_begin while none is bound;
 * for a strategy with take_values (1.7), for every parameter in create,
 * and for a claimed one from then on while none is bound, but within its
 * unit's take_values (ddp/abi/strategy.h). */
typedef struct ddp_param {
  const char* name;
  size_t index; /* position in the parameter table */
  void* data;
  void* grad;
  size_t numel;
  ddp_dtype dtype;
  int trainable; /* 0: frozen, never touched, never fires on_grad_ready */
  /* (ABI 1.4) */
  size_t ndim;          /* dimensions of `shape` (0 for a scalar) */
  const int64_t* shape; /* [ndim]; their product is numel */
  size_t unit;          /* the unit that owns it (ddp_unit::index), or DDP_NO_UNIT */
  int32_t uses;         /* layers that read it per forward: 2 for a tied weight, 0 for an unused one */
} ddp_param;

/* (ABI 1.4) A unit: parameters that compute together (FSDP's wrapped
 * module: the embedding, one Transformer block, the final norm with the
 * head). Units are numbered in forward order; every parameter belongs to
 * exactly one, its owner (ddp_param::unit). A unit may also read
 * parameters another unit owns: tied weights, listed in `tied`. The table
 * is the model's, fixed for the run and the same on every rank. */
typedef struct ddp_unit {
  const char* name;     /* "layers.0", as the parameters' prefix where there is one */
  size_t index;         /* its position in forward order */
  const size_t* params; /* the parameters it owns, ascending table indices */
  size_t param_count;
  const size_t* tied; /* the parameters of other units it reads too, ascending */
  size_t tied_count;
} ddp_unit;

/* (ABI 1.4) Where a unit hook fires (ddp_strategy_v1_t::on_unit). */
typedef enum ddp_unit_phase {
  DDP_UNIT_FORWARD_BEGIN = 0,
  DDP_UNIT_FORWARD_END = 1,
  DDP_UNIT_BACKWARD_BEGIN = 2,
  DDP_UNIT_BACKWARD_END = 3
} ddp_unit_phase;

/* (ABI 1.4) Storage a strategy may own (ddp_host::claim and bind). */
typedef enum ddp_storage {
  DDP_STORAGE_GRAD = 0, /* a parameter's gradient (caps DDP_CAP_OWNS_GRADIENTS) */
  DDP_STORAGE_DATA = 1  /* (1.5) its values (caps DDP_CAP_OWNS_PARAMETERS) */
} ddp_storage;

/* (ABI 1.4) Elements [offset, offset + count) of parameter `param`: a
 * slice of it, which may end anywhere inside it (a shard need not hold
 * whole parameters). `grad` holds the slice's gradient and `data` its
 * values, `count` float32 each, on the run's device; NULL means the
 * parameter's own (ddp_param::grad or data, + offset). Passed as arrays:
 * this struct never grows (see the top). */
typedef struct ddp_range {
  size_t param;
  size_t offset;
  size_t count;
  void* grad;
  void* data;
} ddp_range;

/* (ABI 1.8) A named buffer of a strategy's own state: `count` float32 at
 * `ptr` on the run's device, under `name` (unique, [A-Za-z0-9_.]).
 * Passed as arrays: this struct never grows. */
typedef struct ddp_state_buffer {
  const char* name;
  void* ptr;
  size_t count;
} ddp_state_buffer;

/* (ABI 1.9) Who holds a buffer of a strategy's own state (ddp_strategy_v1_t
 * state_scopes): this rank alone (PowerSGD's error feedback), or every
 * rank the same values (its warm-started Q, DiLoCo's global model). A
 * checkpoint keeps the first per rank and the second once, and a resume
 * on another world size takes up the second. */
typedef enum ddp_state_scope { DDP_STATE_PER_RANK = 0, DDP_STATE_EQUAL = 1 } ddp_state_scope;

/* (ABI 1.9) Elements [offset, offset + count) of parameter `param`'s
 * averaged gradient that this rank holds, `count` float32 at `grad` on the
 * run's device (NULL: the engine's own gradient of the parameter, +
 * offset), and how many ranks hold these same elements, this one
 * included: 1 for a shard held once (ZeRO), r for a shard replicated
 * across r groups (HSDP), world_size for a gradient every rank holds.
 * The gradient norm counts each element once: every rank's squares
 * divided by `replicas`. Passed as arrays: this struct never grows. */
typedef struct ddp_held_range {
  size_t param;
  size_t offset;
  size_t count;
  void* grad;
  int32_t replicas;
} ddp_held_range;

/* (ABI 1.9) A group of ranks with a communicator of its own (ddp_host::
 * split and group): the world, or the ranks that passed one color to
 * split. The host owns it; it lives until the strategy is destroyed. */
typedef struct ddp_group {
  uint32_t struct_size; /* sizeof(ddp_group) as the engine knows it */
  const char* name;     /* "world", or the name given to split */
  int rank;             /* this rank's place in it, 0 .. size - 1 */
  int size;
  const int* ranks; /* [size]: each member's world rank, in group order */
  int color;        /* split's color (the world: 0) */
} ddp_group;

/* (ABI 1.9) What a transport's split is asked to make (ddp_transport_v1_t::
 * split): the group of the ranks of the parent communicator that passed
 * `color`, in which this rank has place `rank` of `size`, in the order the
 * engine computed from every rank's color and key (key, then the rank in
 * the parent: MPI_Comm_split's and ncclCommSplit's). `tag` is the same on
 * every member and unique per group of the run ("ddp.group.3.1"): a prefix
 * for rendezvous keys. Passed by pointer; grows at the end (struct_size). */
typedef struct ddp_split {
  uint32_t struct_size; /* sizeof(ddp_split) as the engine knows it */
  int color;
  int key;
  int rank;
  int size;
  const char* tag;
} ddp_split;

/* (ABI 1.9) A batch of matrix products for ddp_host::gemm, float32,
 * row-major, on the run's device (OpenBLAS's sgemm, cuBLAS's strided
 * batched sgemm): for b < batch,
 *   C_b = alpha op(A_b) op(B_b) + beta C_b,
 * C_b m x n at c + b stride_c, op(A_b) m x k (A_b k x m where trans_a) at
 * a + b stride_a, op(B_b) k x n (B_b n x k where trans_b) at b + b
 * stride_b; lda, ldb, ldc: elements from one row to the next. beta 0
 * overwrites C (a NaN there included). Set by the plugin; struct_size
 * says which fields it knows. */
typedef struct ddp_gemm {
  uint32_t struct_size; /* sizeof(ddp_gemm) as the plugin knows it */
  int trans_a;          /* 1: op(A) is A transposed */
  int trans_b;
  size_t m;
  size_t n;
  size_t k;
  double alpha;
  double beta;
  const float* a;
  size_t lda;
  size_t stride_a;
  const float* b;
  size_t ldb;
  size_t stride_b;
  float* c;
  size_t ldc;
  size_t stride_c;
  size_t batch; /* products, >= 1 */
} ddp_gemm;

/* (ABI 1.9) `count` float32 vectors of `length` elements on the run's
 * device, for ddp_host's dot, norm, axpy and normalize: element j of
 * vector i at ptr[i * stride + j * inc] (a matrix's rows: inc 1, stride
 * its row length; its columns: inc the row length, stride 1). Never
 * grows. */
typedef struct ddp_vectors {
  float* ptr;
  size_t length;
  size_t inc;
  size_t count;
  size_t stride;
} ddp_vectors;

/* (ABI 1.11) The run's [precision] (ddp_host::precision): what a strategy
 * follows where its own keys do not say otherwise. May grow at the end. */
typedef struct ddp_precision {
  uint32_t struct_size; /* sizeof(ddp_precision) as the engine knows it */
  /* The dtype the model's matrix products take their inputs in ([precision]
   * compute): parameters gathered for them may travel in it (FSDP's
   * param_dtype). Master weights, gradients and optimizer state stay
   * float32 whatever it is. */
  ddp_dtype compute;
  /* The dtype gradients are reduced in ([precision] reduce; FSDP's
   * reduce_dtype, DDP's bf16 compress hook). Other than DDP_FLOAT32 only
   * where the strategy's caps have DDP_CAP_REDUCE_DTYPE: the engine refuses
   * the run otherwise, naming the key. */
  ddp_dtype reduce;
  /* 1 where the loss is scaled ([precision] loss_scale = "dynamic", fp16's
   * default, as GradScaler): the gradients a strategy reduces carry a scale
   * that changes between steps, and a step whose gradients hold an inf or
   * NaN on any rank is skipped (no optimizer update). A strategy that keeps
   * state made of gradients (error feedback) must not keep theirs: it keeps
   * it divided by the step's scale (1.12, ddp_step_info::loss_scale) and
   * puts back what it held before a skipped step. Part of 1.11 as
   * released: every engine that has ddp_host::precision fills it. */
  int32_t loss_scaled;
} ddp_precision;

/* Opaque handles: streams and events are the host's, the others belong to
 * the plugin that made them. */
typedef struct ddp_stream_s* ddp_stream;
typedef struct ddp_event_s* ddp_event;
typedef struct ddp_comm_s ddp_comm;
typedef struct ddp_strategy_s ddp_strategy;

/* Work enqueued with host->launch_host_func. Called exactly once, on the
 * stream's executor, in stream order. If the stream has already failed,
 * `cancelled` is 1 and the function must only release `user`. Returns
 * DDP_OK, or an error (after host->set_error) that fails the stream. */
typedef ddp_status (*ddp_host_func)(void* user, int cancelled);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DDP_ABI_VALUES_H */
