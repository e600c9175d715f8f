# DDP_SANITIZE: build everything with AddressSanitizer and
# UndefinedBehaviorSanitizer (any report is fatal), as the `sanitize`
# preset does. DDP_FUZZ (Clang only): also the libFuzzer targets of
# tests/fuzz, with the whole build instrumented for their coverage.
option(DDP_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(DDP_FUZZ "Build the libFuzzer targets (needs Clang)" OFF)
if(DDP_SANITIZE)
  set(ddp_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${ddp_san}>")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")  # instrumented loops may not vectorize as `omp simd` asks
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-Wno-pass-failed>")
    # Line tables are what a sanitizer's report needs (file:line of each
    # frame); full debug info made compiling and linking about 10 % slower.
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-gline-tables-only>")
  endif()
  add_link_options(${ddp_san})
endif()
if(DDP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DDP_FUZZ needs Clang (libFuzzer): configure with the `sanitize` preset")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
endif()
