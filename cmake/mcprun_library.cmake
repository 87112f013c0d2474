# mcprun_library(<name> FOLDER <folder> [DEPENDS <mcprun libraries>] [LINK <other libraries>]
#                SOURCES <files>)
#
# One subsystem: a static library built from one folder. Its files may include headers from their
# own folder and from the folders of DEPENDS (and theirs, transitively), nothing else: an include
# that reaches up or sideways fails the build (cmake/check_layering.cmake), so the dependency
# graph in ARCHITECTURE.md is the one the code has.
function(mcprun_library name)
  cmake_parse_arguments(arg "" "FOLDER" "DEPENDS;LINK;SOURCES" ${ARGN})
  add_library(${name} STATIC ${arg_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${arg_DEPENDS} ${arg_LINK})

  set(allowed ${arg_FOLDER})
  foreach(dependency IN LISTS arg_DEPENDS)
    get_property(folders GLOBAL PROPERTY MCPRUN_FOLDERS_${dependency})
    if(NOT folders)
      message(FATAL_ERROR "${name}: DEPENDS ${dependency}, which is not an mcprun_library defined before it")
    endif()
    list(APPEND allowed ${folders})
  endforeach()
  list(REMOVE_DUPLICATES allowed)
  set_property(GLOBAL PROPERTY MCPRUN_FOLDERS_${name} ${allowed})

  file(GLOB files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${arg_FOLDER}/*.hpp
                                    ${PROJECT_SOURCE_DIR}/${arg_FOLDER}/*.cpp)
  set(stamp ${CMAKE_CURRENT_BINARY_DIR}/${name}.layering)
  # ','-joined: a ';' would split the command line.
  string(REPLACE ";" "," allowed_arg "${allowed}")
  string(REPLACE ";" "," files_arg "${files}")
  add_custom_command(OUTPUT ${stamp}
    COMMAND ${CMAKE_COMMAND} -DLIBRARY=${name} -DALLOWED=${allowed_arg} -DFILES=${files_arg}
            -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DSTAMP=${stamp}
            -P ${PROJECT_SOURCE_DIR}/cmake/check_layering.cmake
    DEPENDS ${files} ${PROJECT_SOURCE_DIR}/cmake/check_layering.cmake
    COMMENT "Checking ${arg_FOLDER}'s includes against ${name}'s dependencies" VERBATIM)
  add_custom_target(${name}_layering DEPENDS ${stamp})
  add_dependencies(${name} ${name}_layering)
endfunction()
