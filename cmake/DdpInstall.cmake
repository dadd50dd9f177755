# Installed package: headers, libraries, a CMake package (find_package(ddp)) and pkg-config.
#
#   cmake --install build --prefix /opt/ddp
#   # a user project:
#   find_package(ddp REQUIRED)             # with CMAKE_PREFIX_PATH=/opt/ddp
#   target_link_libraries(train PRIVATE ddp::runtime)
#   # or: g++ -std=c++20 train.cpp $(pkg-config --cflags --libs ddp)
#
# Two install components, one Debian package each (cmake/DdpPackage.cmake):
#   ddprun  the programs: ddprun and ddpstore, ddprun's Python probe and NCCL profiler plugin
#   dev     libraries, headers, the CMake package and ddp.pc (libddp-dev)
include(CMakePackageConfigHelpers)

set(DDP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)

set(_ddp_export_targets ddp_store ddp_etcd ddp_elastic ddp_rendezvous ddp_runtime)
if(TARGET ddp_nccl)
  list(APPEND _ddp_export_targets ddp_nccl)  # the runtime's link to NCCL + cudart
endif()
install(TARGETS ${_ddp_export_targets} EXPORT ddpTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY rendezvous/include/ runtime/include/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.hpp")
foreach(_ddp_program ddprun ddpstore)
  if(TARGET ${_ddp_program})
    install(TARGETS ${_ddp_program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ddprun)
  endif()
endforeach()
# ddprun's NCCL profiler plugin, in the lib dir beside the installed ddprun (where
# find_nccl_profiler looks), loaded by the workers' NCCL.
if(TARGET ddprun_nccl_profiler)
  install(TARGETS ddprun_nccl_profiler LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT ddprun)
endif()
# ddprun's Python probe (worker/CMakeLists.txt), read-only for all but its owner.
list(TRANSFORM DDP_PYTHON_PROBE_FILES PREPEND worker/ OUTPUT_VARIABLE _ddp_probe_sources)
install(FILES ${_ddp_probe_sources} DESTINATION ${CMAKE_INSTALL_DATADIR}/ddprun/python
  PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ COMPONENT ddprun)
# ddprun's Python package (ddprun.inplace), beside it: the probe offers it to workers under
# --restart_policy=inplace; the wheel and the .deb also put it on Python's own path.
list(TRANSFORM DDP_PYTHON_PACKAGE_FILES PREPEND worker/python_package/
     OUTPUT_VARIABLE _ddp_package_sources)
install(FILES ${_ddp_package_sources} DESTINATION ${CMAKE_INSTALL_DATADIR}/ddprun/python-package/ddprun
  PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ COMPONENT ddprun)
if(DDP_PYTHON_DIST_PACKAGES)
  install(FILES ${_ddp_package_sources} DESTINATION ${DDP_PYTHON_DIST_PACKAGES}/ddprun
    PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ COMPONENT ddprun)
endif()

install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${DDP_INSTALL_CMAKEDIR} COMPONENT dev)
configure_package_config_file(cmake/ddpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ddpConfig.cmake INSTALL_DESTINATION ${DDP_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  DESTINATION ${DDP_INSTALL_CMAKEDIR} COMPONENT dev)

# pkg-config: static libraries, so every dependency is listed in Libs.
set(DDP_PC_LIBS "-lddp_runtime -lddp_store -lgloo -pthread")
if(DDP_HAVE_CUDA)
  string(APPEND DDP_PC_LIBS " ${NCCL_LIBRARY} -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
# Relocatable: the prefix is found from the .pc file's own place (cmake --install --prefix).
file(RELATIVE_PATH DDP_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" DDP_PC_TO_PREFIX "${DDP_PC_TO_PREFIX}")
configure_file(cmake/ddp.pc.in ${PROJECT_BINARY_DIR}/ddp.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ddp.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT dev)
