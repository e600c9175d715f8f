/* powersgd_c.c — a PowerSGD-style strategy written in C against the
 * installed headers alone (<ddp/plugin.h>), as a plugin author outside the
 * project writes one; simpler than the shipped `powersgd`: full rank (r =
 * min(n, m) for each n × m gradient, its first dimension × the rest), one
 * matrix at a time, every collective of its own, everything in finish on
 * the comm stream. Per trainable gradient of 2+ dimensions, on the
 * micro-batch with sync_grads:
 *   M = grad + error;  orthogonalize Q;  P = M Q;  all-reduce P (sum)
 *   orthogonalize P;  Q = Mᵀ P;  all-reduce Q (sum);  Q /= world
 *   grad = P Qᵀ;  error = M − grad
 * (orthogonalize: Gram-Schmidt on the columns, `col /= |col| + 1e-8`, then
 * the later columns lose their projection on it), and the other gradients
 * averaged where they lie. Where a gradient's rank is r, P spans it and
 * the result is the average (DDP). Compute through ABI 1.9's host entries
 * (gemm, dot, axpy, normalize); the state through `state` (1.8) and
 * `state_scopes` (1.9): each matrix's error this rank's own, its Q equal on
 * every rank. The initial Q of parameter i: uniform in [-1, 1) from a
 * 64-bit LCG seeded with i, the same on every rank. No keys.
 * Built in tree for the conformance suite (tests/CMakeLists.txt) and out of
 * tree by tools/build_example.sh --source tests/kit/powersgd_c. */
#include <ddp/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-8

typedef struct matrix {
  size_t param, rows, cols, rank;
  float *error, *q, *p; /* [rows, cols], [cols, rank], [rows, rank] */
  char *error_name, *q_name;
} matrix;

struct ddp_strategy_s {
  const ddp_host* host;
  const ddp_transport_v1_t* t;
  ddp_comm* comm;
  ddp_event computed, done;
  int syncing;
  matrix* m;
  size_t count;
  float* scratch; /* [largest rank]: Gram-Schmidt's projections */
  ddp_state_buffer* state;
  ddp_state_scope* scopes;
};

static ddp_status fail(const ddp_host* h, ddp_status status, const char* message) {
  h->set_error(h->ctx, message);
  return status;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* A gradient of 2+ dimensions: rows × cols at full rank; 0 for the others. */
static int as_matrix(const ddp_param* p, size_t* rows, size_t* cols) {
  if (!p->trainable || p->ndim < 2 || p->numel == 0) return 0;
  *rows = (size_t)p->shape[0];
  *cols = p->numel / *rows;
  return 1;
}

static char* state_name(const char* param, const char* suffix) {
  char* out = malloc(strlen(param) + strlen(suffix) + 1);
  size_t k = 0;
  if (!out) return NULL;
  for (; param[k]; ++k) {
    const char c = param[k];
    const int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    out[k] = plain ? c : '_';
  }
  strcpy(out + k, suffix);
  return out;
}

static void drop_layout(ddp_strategy* s) {
  const ddp_host* h = s->host;
  for (size_t k = 0; k < s->count; ++k) {
    h->free(h->ctx, s->m[k].error), h->free(h->ctx, s->m[k].q), h->free(h->ctx, s->m[k].p);
    free(s->m[k].error_name), free(s->m[k].q_name);
  }
  h->free(h->ctx, s->scratch);
  free(s->m), free(s->state), free(s->scopes);
  s->m = NULL, s->state = NULL, s->scopes = NULL, s->scratch = NULL, s->count = 0;
}

/* Q's initial values, drawn into malloc'ed memory and copied to the device,
 * waited for (on a CUDA run copy's cudaMemcpyDefault takes pageable memory;
 * the shipped strategy stages through alloc_host instead, planned). */
static ddp_status draw_q(ddp_strategy* s, const matrix* m) {
  const ddp_host* h = s->host;
  const size_t n = m->cols * m->rank;
  float* host = malloc(n * sizeof *host);
  uint64_t x = 0x9e3779b97f4a7c15ull * (m->param + 1);
  ddp_status st;
  if (!host) return fail(h, DDP_ERR_OUT_OF_MEMORY, "out of memory");
  for (size_t k = 0; k < n; ++k) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    host[k] = (float)((double)(x >> 11) * 0x1.0p-52 - 1.0);
  }
  st = h->copy(h->ctx, m->q, host, n * sizeof *host, h->compute_stream(h->ctx));
  if (st == DDP_OK) st = h->event_record(h->ctx, s->computed, h->compute_stream(h->ctx));
  if (st == DDP_OK) st = h->event_synchronize(h->ctx, s->computed);
  free(host);
  return st;
}

/* One matrix's buffers (zeroed by alloc), names, and initial Q. */
static ddp_status make_matrix(ddp_strategy* s, size_t i, size_t rows, size_t cols, matrix* m) {
  const ddp_host* h = s->host;
  const char* name = h->param(h->ctx, i)->name;
  ddp_status st;
  m->param = i, m->rows = rows, m->cols = cols, m->rank = min_size(rows, cols);
  st = h->alloc(h->ctx, rows * cols * sizeof(float), DDP_MEM_OPTIMIZER_STATE, (void**)&m->error);
  if (st == DDP_OK) st = h->alloc(h->ctx, cols * m->rank * sizeof(float), DDP_MEM_OPTIMIZER_STATE, (void**)&m->q);
  if (st == DDP_OK) st = h->alloc(h->ctx, rows * m->rank * sizeof(float), DDP_MEM_COMM_BUFFERS, (void**)&m->p);
  m->error_name = state_name(name, ".error"), m->q_name = state_name(name, ".q");
  if (st == DDP_OK && (!m->error_name || !m->q_name)) return fail(h, DDP_ERR_OUT_OF_MEMORY, "out of memory");
  return st == DDP_OK ? draw_q(s, m) : st;
}

/* The matrices of the trainable set now, at train begin and when it changes
 * (between steps: finish waited for everything that used the last ones). */
static ddp_status lay_out(ddp_strategy* s) {
  const ddp_host* h = s->host;
  const size_t n = h->param_count(h->ctx);
  size_t rows, cols, largest = 1;
  ddp_status st = DDP_OK;
  drop_layout(s);
  s->m = calloc(n ? n : 1, sizeof *s->m);
  s->state = calloc(2 * (n ? n : 1), sizeof *s->state);
  s->scopes = calloc(2 * (n ? n : 1), sizeof *s->scopes);
  if (!s->m || !s->state || !s->scopes) return fail(h, DDP_ERR_OUT_OF_MEMORY, "out of memory");
  for (size_t i = 0; i < n && st == DDP_OK; ++i) {
    if (!as_matrix(h->param(h->ctx, i), &rows, &cols)) continue;
    matrix* m = &s->m[s->count++];
    st = make_matrix(s, i, rows, cols, m);
    if (m->rank > largest) largest = m->rank;
    const ddp_state_buffer e = {m->error_name, m->error, rows * cols}, q = {m->q_name, m->q, cols * m->rank};
    s->state[2 * s->count - 2] = e, s->scopes[2 * s->count - 2] = DDP_STATE_PER_RANK;
    s->state[2 * s->count - 1] = q, s->scopes[2 * s->count - 1] = DDP_STATE_EQUAL;
  }
  if (st == DDP_OK) st = h->alloc(h->ctx, largest * sizeof(float), DDP_MEM_COMM_BUFFERS, (void**)&s->scratch);
  return st;
}

static ddp_status psgd_create(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* comm, ddp_strategy** out) {
  ddp_status st;
  ddp_strategy* s;
  if (!DDP_HOST_HAS(h, gemm) || !DDP_HOST_HAS(h, normalize))
    return fail(h, DDP_ERR_UNSUPPORTED, "powersgd_c computes through the host: it needs an engine of ABI 1.9 or newer");
  s = calloc(1, sizeof *s);
  if (!s) return fail(h, DDP_ERR_OUT_OF_MEMORY, "out of memory");
  s->host = h, s->t = t, s->comm = comm;
  *out = s;
  st = h->event_create(h->ctx, &s->computed);
  return st == DDP_OK ? h->event_create(h->ctx, &s->done) : st;
}

static ddp_status comm_after_compute(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_status st = h->event_record(h->ctx, s->computed, h->compute_stream(h->ctx));
  return st == DDP_OK ? h->stream_wait_event(h->ctx, h->comm_stream(h->ctx), s->computed) : st;
}
static ddp_status wait_comm(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_status st = h->event_record(h->ctx, s->done, h->comm_stream(h->ctx));
  return st == DDP_OK ? h->event_synchronize(h->ctx, s->done) : st;
}

static ddp_status psgd_train_begin(ddp_strategy* s) {
  const ddp_host* h = s->host;
  ddp_status st = comm_after_compute(s);
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    const ddp_buffer b = {p->data, p->numel, DDP_FLOAT32, h->device};
    st = s->t->broadcast(s->comm, &b, 0, h->comm_stream(h->ctx));
  }
  if (st == DDP_OK) st = wait_comm(s);
  return st == DDP_OK ? lay_out(s) : st;
}

static ddp_status psgd_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  s->syncing = info->sync_grads;
  return info->params_changed ? lay_out(s) : DDP_OK;
}

/* Gram-Schmidt on the columns of x [rows, rank], on the comm stream. */
static ddp_status orthogonalize(ddp_strategy* s, float* x, size_t rows, size_t rank) {
  const ddp_host* h = s->host;
  const ddp_stream c = h->comm_stream(h->ctx);
  ddp_status st = DDP_OK;
  for (size_t i = 0; i < rank && st == DDP_OK; ++i) {
    const size_t later = rank - 1 - i;
    const ddp_vectors col = {x + i, rows, rank, 1, 1};
    const ddp_vectors ci = {x + i, rows, rank, later, 0}, rest = {x + i + 1, rows, rank, later, 1};
    st = h->normalize(h->ctx, &col, EPS, c);
    if (st == DDP_OK && later) st = h->dot(h->ctx, &ci, &rest, s->scratch, c);
    if (st == DDP_OK && later) st = h->axpy(h->ctx, -1.0, &ci, s->scratch, &rest, c);
  }
  return st;
}

/* C = op(A) op(B), row-major, on the comm stream. */
static ddp_status product(ddp_strategy* s, int ta, int tb, size_t m, size_t n, size_t k, const float* a, size_t lda,
                          const float* b, size_t ldb, float* c, size_t ldc) {
  ddp_gemm g;
  memset(&g, 0, sizeof g);
  g.struct_size = sizeof g, g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = 1.0, g.beta = 0.0;
  g.a = a, g.lda = lda, g.b = b, g.ldb = ldb, g.c = c, g.ldc = ldc, g.batch = 1;
  return s->host->gemm(s->host->ctx, &g, s->host->comm_stream(s->host->ctx));
}

static ddp_status compress(ddp_strategy* s, const matrix* m, float* grad) {
  const ddp_host* h = s->host;
  const ddp_stream c = h->comm_stream(h->ctx);
  const size_t n = m->rows, k = m->cols, r = m->rank;
  const ddp_vectors g = {grad, n * k, 1, 1, n * k}, e = {m->error, n * k, 1, 1, n * k};
  const ddp_buffer p = {m->p, n * r, DDP_FLOAT32, h->device}, q = {m->q, k * r, DDP_FLOAT32, h->device};
  ddp_status st = h->axpy(h->ctx, 1.0, &g, NULL, &e, c); /* error holds M */
  if (st == DDP_OK) st = orthogonalize(s, m->q, k, r);
  if (st == DDP_OK) st = product(s, 0, 0, n, r, k, m->error, k, m->q, r, m->p, r);
  if (st == DDP_OK) st = s->t->all_reduce(s->comm, &p, DDP_REDUCE_SUM, c);
  if (st == DDP_OK) st = orthogonalize(s, m->p, n, r);
  if (st == DDP_OK) st = product(s, 1, 0, k, r, n, m->error, k, m->p, r, m->q, r);
  if (st == DDP_OK) st = s->t->all_reduce(s->comm, &q, DDP_REDUCE_SUM, c);
  if (st == DDP_OK) st = h->scale(h->ctx, &q, 1.0 / h->world_size, c);
  if (st == DDP_OK) st = product(s, 0, 1, n, k, r, m->p, r, m->q, r, grad, k);
  return st == DDP_OK ? h->axpy(h->ctx, -1.0, &g, NULL, &e, c) : st; /* error = M − grad */
}

static ddp_status psgd_finish(ddp_strategy* s) {
  const ddp_host* h = s->host;
  size_t next = 0, rows, cols;
  ddp_status st;
  if (!s->syncing) return DDP_OK;
  st = comm_after_compute(s);
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    if (!p->trainable || p->numel == 0) continue;
    if (as_matrix(p, &rows, &cols)) {
      st = compress(s, &s->m[next++], p->grad);
    } else {
      const ddp_buffer b = {p->grad, p->numel, DDP_FLOAT32, h->device};
      st = s->t->all_reduce(s->comm, &b, DDP_REDUCE_AVG, h->comm_stream(h->ctx));
    }
  }
  return st == DDP_OK ? wait_comm(s) : st;
}

static ddp_status psgd_state(ddp_strategy* s, const ddp_state_buffer** out, size_t* count) {
  *out = s->state, *count = 2 * s->count;
  return DDP_OK;
}

static ddp_status psgd_state_scopes(ddp_strategy* s, const ddp_state_scope** scopes, size_t* count) {
  *scopes = s->scopes, *count = 2 * s->count;
  return DDP_OK;
}

static void psgd_destroy(ddp_strategy* s) {
  if (!s) return;
  drop_layout(s);
  if (s->computed) s->host->event_destroy(s->host->ctx, s->computed);
  if (s->done) s->host->event_destroy(s->host->ctx, s->done);
  free(s);
}

/* `ddp plan`: per trainable parameter in table order an average, or P's
 * and Q's sums; each matrix's error and Q, its P, and the projections. */
static ddp_status psgd_plan(const ddp_host* h, const ddp_transport_v1_t* t, ddp_plan* plan) {
  size_t rows, cols, largest = 1;
  ddp_status st = DDP_OK;
  (void)t;
  for (size_t i = 0; i < h->param_count(h->ctx) && st == DDP_OK; ++i) {
    const ddp_param* p = h->param(h->ctx, i);
    if (!p->trainable || p->numel == 0) continue;
    if (!as_matrix(p, &rows, &cols)) {
      const ddp_plan_collective c = {DDP_OP_ALL_REDUCE, p->numel, DDP_FLOAT32, 0};
      st = plan->collective(plan->ctx, &c);
      continue;
    }
    const size_t r = min_size(rows, cols);
    const ddp_plan_collective cp = {DDP_OP_ALL_REDUCE, rows * r, DDP_FLOAT32, 0};
    const ddp_plan_collective cq = {DDP_OP_ALL_REDUCE, cols * r, DDP_FLOAT32, 0};
    if (r > largest) largest = r;
    st = plan->buffer(plan->ctx, DDP_MEM_OPTIMIZER_STATE, rows * cols * sizeof(float), DDP_PLAN_SETUP);
    if (st == DDP_OK) st = plan->buffer(plan->ctx, DDP_MEM_OPTIMIZER_STATE, cols * r * sizeof(float), DDP_PLAN_SETUP);
    if (st == DDP_OK) st = plan->buffer(plan->ctx, DDP_MEM_COMM_BUFFERS, rows * r * sizeof(float), DDP_PLAN_SETUP);
    if (st == DDP_OK) st = plan->collective(plan->ctx, &cp);
    if (st == DDP_OK) st = plan->collective(plan->ctx, &cq);
  }
  return st == DDP_OK ? plan->buffer(plan->ctx, DDP_MEM_COMM_BUFFERS, largest * sizeof(float), DDP_PLAN_SETUP) : st;
}

static const ddp_key kKeys[] = {{NULL, NULL, NULL}};

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "powersgd_c",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
    .create = psgd_create,
    .on_train_begin = psgd_train_begin,
    .on_step_begin = psgd_step_begin,
    .finish = psgd_finish,
    .destroy = psgd_destroy,
    .keys = kKeys,
    .plan = psgd_plan,
    .state = psgd_state,
    .state_scopes = psgd_state_scopes,
};
