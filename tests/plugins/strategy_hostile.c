/* A strategy whose code misbehaves where the launcher runs it, before any
 * rank starts: in a constructor (dlopen runs it) or in its plan entry.
 * Built once per variant (tests/plugins/CMakeLists.txt), each named as its
 * file: ctor_exit, ctor_crash, ctor_hang, plan_exit, plan_crash,
 * plan_abort, plan_hang. Otherwise a strategy that plans nothing. */
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "stubs.h"

static void misbehave(void) {
#if defined(CTOR_EXIT) || defined(PLAN_EXIT)
  exit(0);
#elif defined(CTOR_CRASH) || defined(PLAN_CRASH)
  raise(SIGSEGV); /* a fault as the kernel delivers it; not a null store, which
                     the sanitize build's UBSan would stop first */
#elif defined(PLAN_ABORT)
  abort();
#else
  for (;;) pause();
#endif
}

#if defined(CTOR_EXIT) || defined(CTOR_CRASH) || defined(CTOR_HANG)
__attribute__((constructor)) static void on_load(void) { misbehave(); }
#endif

static ddp_status hostile_plan(const ddp_host* host, const ddp_transport_v1_t* t, ddp_plan* plan) {
  (void)host, (void)t, (void)plan;
#if defined(PLAN_EXIT) || defined(PLAN_CRASH) || defined(PLAN_ABORT) || defined(PLAN_HANG)
  misbehave();
#endif
  return DDP_OK;
}

#if defined(CTOR_EXIT)
#define NAME "hostile_ctor_exit"
#elif defined(CTOR_CRASH)
#define NAME "hostile_ctor_crash"
#elif defined(CTOR_HANG)
#define NAME "hostile_ctor_hang"
#elif defined(PLAN_EXIT)
#define NAME "hostile_plan_exit"
#elif defined(PLAN_CRASH)
#define NAME "hostile_plan_crash"
#elif defined(PLAN_ABORT)
#define NAME "hostile_plan_abort"
#else
#define NAME "hostile_plan_hang"
#endif

DDP_STRATEGY_ENTRY = {STUB_STRATEGY_FIELDS, .name = NAME, .plan = hostile_plan};
