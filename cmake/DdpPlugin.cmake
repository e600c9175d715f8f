# ddp_add_plugin(<kind> <name> SOURCES ... [LIBS ...])
# Builds libddp_<kind>_<name>.so as a MODULE that exports exactly its
# versioned entry symbol (ddp_<kind>_v1): hidden visibility for our code and
# a linker version script for everything else (inline templates of the C++
# library would otherwise be exported as weak symbols). Links nothing of the
# engine.
function(ddp_add_plugin kind name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT kind MATCHES "^(strategy|transport)$")
    message(FATAL_ERROR "ddp_add_plugin: kind must be strategy or transport, not '${kind}'")
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
  target_link_options(${target} PRIVATE -Wl,--no-undefined -Wl,--exclude-libs,ALL
                      -Wl,--version-script=${map})
  install(TARGETS ${target} LIBRARY DESTINATION ${DDP_PLUGIN_SUBDIR})
endfunction()
