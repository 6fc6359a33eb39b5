# Installs libstrata, its one header, the CLI, a CMake package (find_package(strata)) and a
# pkg-config file.
include(CMakePackageConfigHelpers)

install(TARGETS strata EXPORT strataTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/strata)
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/strataConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/strataConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/strataConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/strataConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/strataConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)

# The .pc file names its prefix relative to its own directory (${pcfiledir}/../..) rather than
# the configured CMAKE_INSTALL_PREFIX, which `cmake --install --prefix P` does not change.
# Absolute GNUInstallDirs values (an explicit -DCMAKE_INSTALL_LIBDIR=/opt/lib) stay absolute.
set(STRATA_PC_PREFIX "\${pcfiledir}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(STRATA_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  string(REPLACE "/" ";" libdir_parts "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  foreach(part IN LISTS libdir_parts)
    if(part AND NOT part STREQUAL ".")
      string(APPEND STRATA_PC_PREFIX "/..")
    endif()
  endforeach()
endif()
foreach(dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${dir}}")
    set(STRATA_PC_${dir} "${CMAKE_INSTALL_${dir}}")
  else()
    set(STRATA_PC_${dir} "\${prefix}/${CMAKE_INSTALL_${dir}}")
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/strata.pc.in ${CMAKE_CURRENT_BINARY_DIR}/strata.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/strata.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
