# ddp_add_plugin(<strategy|transport> <name> SOURCES ... [LIBS ...])
# Builds libddp_<kind>_<name>.so as a MODULE that exports exactly its
# versioned entry symbol (ddp_<kind>_v1): hidden visibility for our code and
# a linker version script for everything else (inline templates of the C++
# library would otherwise be exported as weak symbols). Links nothing of the
# engine: only the header-only target ddp::plugin_api.
#
# Used both in the ddp source tree and, installed beside ddpConfig.cmake, by
# out-of-tree plugins (find_package(ddp) provides it). A plugin is installed
# (install(TARGETS ... DESTINATION ${DDP_PLUGIN_INSTALL_DIR})) only where
# DDP_PLUGIN_INSTALL_DIR is set: the ddp tree sets it to lib/ddp; an
# out-of-tree project may set it too, or leave the .so where it is built and
# name it by path in the TOML file.
function(ddp_add_plugin kind name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT kind MATCHES "^(strategy|transport)$")
    message(FATAL_ERROR "ddp_add_plugin: kind must be strategy or transport, not '${kind}'")
  endif()
  if(NOT TARGET ddp::plugin_api)
    message(FATAL_ERROR "ddp_add_plugin: target ddp::plugin_api is missing (use find_package(ddp))")
  endif()
  set(target ddp_${kind}_${name})
  set(map ${CMAKE_CURRENT_BINARY_DIR}/${target}.map)
  file(WRITE ${map} "{ global: ddp_${kind}_v1; local: *; };\n")
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME ddp_${kind}_${name}
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LINK_DEPENDS ${map})
  target_link_libraries(${target} PRIVATE ddp::plugin_api ${P_LIBS})
  # C++20 for the descriptor's designated initializers (a C plugin: C99).
  # The entries a descriptor does not name are NULL on purpose: GCC's
  # -Wextra would warn of each (it does not in C).
  get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if("CXX" IN_LIST languages)  # (a C plugin's project may enable C alone)
    target_compile_features(${target} PRIVATE cxx_std_20)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-missing-field-initializers>)
  endif()
  target_link_options(${target} PRIVATE -Wl,--exclude-libs,ALL -Wl,--version-script=${map})
  # Every symbol resolved at link time, but in a sanitized build (DDP_SANITIZE):
  # there the sanitizers' runtime is in the executable that loads the plugin.
  if(NOT DDP_SANITIZE)
    target_link_options(${target} PRIVATE -Wl,--no-undefined)
  endif()
  if(DDP_PLUGIN_INSTALL_DIR)
    install(TARGETS ${target} LIBRARY DESTINATION ${DDP_PLUGIN_INSTALL_DIR})
  endif()
endfunction()
