# ddp_add_plugin(<kind> <name> SOURCES ... [LIBS ...])
# Builds libddp_<kind>_<name>.so as a MODULE with hidden visibility, so it
# exports exactly its versioned entry symbol, and links nothing of the engine.
function(ddp_add_plugin kind name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  set(target ddp_${kind}_${name})
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME ddp_${kind}_${name}
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(${target} PRIVATE ddp::plugin_api ${P_LIBS})
  target_link_options(${target} PRIVATE -Wl,--no-undefined -Wl,--exclude-libs,ALL)
  install(TARGETS ${target} LIBRARY DESTINATION ${DDP_PLUGIN_SUBDIR})
endfunction()
