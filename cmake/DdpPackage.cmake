# Install rules for what a plugin author needs, as the CMake package `ddp`:
#   include/ddp/plugin.h, abi/*.h        the ABI: the umbrella and its parts
#   include/ddp/plugin.hpp, numeric.h,   the optional header-only helpers
#     transport.hpp, overhead_model.hpp  (C++17, but numeric.h: C99)
#   lib/cmake/ddp/ddpConfig*.cmake       find_package(ddp): ddp::plugin_api
#   lib/cmake/ddp/DdpPlugin.cmake        ddp_add_plugin(), as used in tree
#   include/ddp/strategy/*.h             the strategy kit: strategies/common's
#                                        header-only helpers, ddp::strategy_common
#                                        (installed by strategies/common)
#   bin/ddp-mpirun-ranks                 tests/mpirun_ranks.sh: a GoogleTest program
#                                        (ddp-conformance) as ranks of mpirun
# (bin/ddp and lib/ddp/libddp_*.so are installed by their own directories.)
# The package depends on nothing but the headers.
include(CMakePackageConfigHelpers)

set(DDP_INSTALL_INCLUDEDIR include)
set(DDP_INSTALL_BINDIR bin)
set(DDP_INSTALL_CMAKEDIR lib/cmake/ddp)

# Every header of plugins/include/ddp, as the tree has them: a plugin that
# builds in tree against ddp::plugin_api builds the same against the install.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/plugins/include/ddp
        DESTINATION ${DDP_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

set_target_properties(ddp_plugin_api PROPERTIES EXPORT_NAME plugin_api)
install(TARGETS ddp_plugin_api EXPORT ddpTargets)
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${DDP_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ddpConfig.cmake
  INSTALL_DESTINATION ${DDP_INSTALL_CMAKEDIR}
  PATH_VARS DDP_INSTALL_INCLUDEDIR DDP_INSTALL_BINDIR DDP_PLUGIN_SUBDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ddpConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/ddpConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/ddpConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/DdpPlugin.cmake
  DESTINATION ${DDP_INSTALL_CMAKEDIR})

# The conformance suite over a transport whose ranks only mpirun starts
# (mpi): `ddp-mpirun-ranks 2 ddp-conformance --transport mpi ...`.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tests/mpirun_ranks.sh DESTINATION ${DDP_INSTALL_BINDIR} RENAME ddp-mpirun-ranks)
