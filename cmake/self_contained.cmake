# The self-contained programs of the wheel (MCPRUN_SELF_CONTAINED): yaml-cpp from Debian's static
# archive (OpenSSL's too, found as OPENSSL_USE_STATIC_LIBS asks), spdlog and fmt compiled here
# from their headers, libstdc++ and libgcc linked statically, so that mcprun and rendezvousd need
# only the C library. Only the link changes: the
# imported targets keep their usage requirements, so every object compiles exactly as in the
# shared build (and ccache serves it from there).
find_library(MCPRUN_YAML_CPP_ARCHIVE NAMES libyaml-cpp.a REQUIRED)

add_library(mcprun_spdlog_fmt STATIC ${CMAKE_CURRENT_LIST_DIR}/self_contained/spdlog.cpp
                                     ${CMAKE_CURRENT_LIST_DIR}/self_contained/fmt.cpp)
target_compile_definitions(mcprun_spdlog_fmt PRIVATE
  $<TARGET_PROPERTY:spdlog::spdlog,INTERFACE_COMPILE_DEFINITIONS>
  $<TARGET_PROPERTY:fmt::fmt,INTERFACE_COMPILE_DEFINITIONS>)
target_link_libraries(mcprun_spdlog_fmt PUBLIC Threads::Threads)
set_target_properties(mcprun_spdlog_fmt PROPERTIES ARCHIVE_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/self_contained)
set(spdlog_fmt_archive ${PROJECT_BINARY_DIR}/self_contained/libmcprun_spdlog_fmt.a)

# An imported library's configurations each name its file; all of them now name the archive.
function(mcprun_link_archive imported archive)
  get_target_property(configurations ${imported} IMPORTED_CONFIGURATIONS)
  foreach(configuration IN LISTS configurations)
    set_target_properties(${imported} PROPERTIES IMPORTED_LOCATION_${configuration} ${archive}
                                                 IMPORTED_SONAME_${configuration} "")
  endforeach()
endfunction()
mcprun_link_archive(yaml-cpp ${MCPRUN_YAML_CPP_ARCHIVE})
mcprun_link_archive(fmt::fmt ${spdlog_fmt_archive})
mcprun_link_archive(spdlog::spdlog ${spdlog_fmt_archive})
# Links the archive's target too, so that it is built before any program that links spdlog.
set_property(TARGET spdlog::spdlog APPEND PROPERTY INTERFACE_LINK_LIBRARIES mcprun_spdlog_fmt)

add_link_options(-static-libstdc++ -static-libgcc)
