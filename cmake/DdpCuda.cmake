# The optional GPU path: CUDA, cuBLAS and NCCL (under /usr/local/cuda).
#
# DDP_WITH_CUDA is ON by default where a CUDA compiler (nvcc) is found, OFF
# otherwise; -DDDP_WITH_CUDA=OFF builds the CPU path alone, exactly as without
# a toolkit. When ON, this provides:
#   - the CUDA language, for CMAKE_CUDA_ARCHITECTURES (default 90, H100; set
#     -DCMAKE_CUDA_ARCHITECTURES="80;90" or all-major for others: `native`
#     fails on a machine without a GPU, and CUDA 13 has nothing below 75);
#   - CUDA::cudart, CUDA::cublas (find_package(CUDAToolkit));
#   - NCCL::nccl, an imported target over the toolkit's nccl.h / libnccl.
# CUDA sources link the shared runtime (CMAKE_CUDA_RUNTIME_LIBRARY Shared):
# CMake's default, the static one, would put libcudart in a target twice
# beside CUDA::cudart.
include(CheckLanguage)
check_language(CUDA)  # nvcc on PATH, in $CUDA_PATH or /usr/local/cuda (CMake's search)
if(CMAKE_CUDA_COMPILER)
  set(ddp_cuda_default ON)
else()
  set(ddp_cuda_default OFF)
endif()
option(DDP_WITH_CUDA "Build the GPU path (CUDA, cuBLAS, the nccl transport)" ${ddp_cuda_default})

if(NOT DDP_WITH_CUDA)
  if(CMAKE_CUDA_COMPILER)
    message(STATUS "ddp: CUDA off (DDP_WITH_CUDA=OFF)")
  else()
    message(STATUS "ddp: CUDA off (no CUDA compiler found; set CMAKE_CUDA_COMPILER to nvcc to enable it)")
  endif()
  return()
endif()
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "DDP_WITH_CUDA is ON but no CUDA compiler was found "
                      "(set CMAKE_CUDA_COMPILER=/path/to/nvcc, or -DDDP_WITH_CUDA=OFF)")
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to build for (90: H100)")
endif()
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# nvcc does not take -Wall: the host compiler gets the project's warnings.
add_compile_options($<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
find_package(CUDAToolkit REQUIRED)

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include)
find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "DDP_WITH_CUDA is ON but NCCL was not found (nccl.h: ${NCCL_INCLUDE_DIR}, "
                      "libnccl: ${NCCL_LIBRARY}); set NCCL_INCLUDE_DIR and NCCL_LIBRARY, or -DDDP_WITH_CUDA=OFF")
endif()
file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h ddp_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE "[^0-9;]" "" ddp_nccl_version "${ddp_nccl_version}")
string(REPLACE ";" "." ddp_nccl_version "${ddp_nccl_version}")
if(NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION ${NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR}
    INTERFACE_LINK_LIBRARIES CUDA::cudart)
endif()

message(STATUS "ddp: CUDA on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, "
               "NCCL ${ddp_nccl_version} at ${NCCL_LIBRARY}; -DDDP_WITH_CUDA=OFF to skip)")
