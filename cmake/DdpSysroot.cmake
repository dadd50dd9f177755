# Toolchain file of the packages (scripts/package; docs/install.md says why): this host's GCC
# compiles and links against the older glibc of a sysroot, so that the programs run wherever
# that glibc or a newer one is. The sysroot is DDP_SYSROOT (default
# /var/lib/ddprun-test/bullseye-sysroot, which scripts/setup-bullseye makes: Debian 11's glibc
# 2.31, and links to this host's Boost, CLI11, nlohmann-json, Gloo, OpenSSL, zlib and BLAS).
#
#   cmake -S . -B build-package -DCMAKE_TOOLCHAIN_FILE=cmake/DdpSysroot.cmake -DDDP_PORTABLE=ON
#
# With DDP_PORTABLE (CMakeLists.txt), packaging/glibc_compat.h declares for every C++ file
# what our code takes from a newer glibc, and the packaged programs get
# packaging/glibc_compat.cpp, which defines it and what this GCC's static runtime takes from a
# newer glibc. Other executables of the tree do not: build the packaged targets only, as
# scripts/package does.
if(NOT DDP_SYSROOT)
  set(DDP_SYSROOT "$ENV{DDP_SYSROOT}")
endif()
if(NOT DDP_SYSROOT)
  set(DDP_SYSROOT /var/lib/ddprun-test/bullseye-sysroot)
endif()
if(NOT EXISTS "${DDP_SYSROOT}/usr/include/features.h")
  message(FATAL_ERROR "DdpSysroot: no glibc in the sysroot ${DDP_SYSROOT}: run "
                      "scripts/setup-bullseye (as root, once), or set DDP_SYSROOT")
endif()
set(DDP_SYSROOT "${DDP_SYSROOT}" CACHE PATH "The sysroot that the build compiles and links against")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES DDP_SYSROOT)  # try_compile reads this file too
set(CMAKE_SYSROOT "${DDP_SYSROOT}")

# A native GCC looks for crt1.o, libc.so and libm.so in this host's /usr/lib/<multiarch>
# before the sysroot's (paths relative to its own installation are not moved into the
# sysroot). -B puts the sysroot's first: a program started by this host's crt1.o on glibc 2.31
# would silently skip its static constructors.
execute_process(COMMAND gcc -print-multiarch OUTPUT_VARIABLE _ddp_multiarch
                OUTPUT_STRIP_TRAILING_WHITESPACE)
foreach(_ddp_kind EXE SHARED MODULE)
  set(CMAKE_${_ddp_kind}_LINKER_FLAGS_INIT
      "-B${DDP_SYSROOT}/usr/lib/${_ddp_multiarch}/ -Wl,-rpath-link,${DDP_SYSROOT}/lib/${_ddp_multiarch}")
endforeach()

# Headers, libraries and CMake packages from the sysroot only: one found in this host's /usr
# would put its /usr/include, and so its glibc headers, on the compile line.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# glibc loads packed relative relocations (DT_RELR) from 2.36 on, and the linker accepts
# -z pack-relative-relocs whatever the glibc (the program then names GLIBC_ABI_DT_RELR, and an
# older glibc refuses to start it): the result of apps/launcher.cmake's check for that flag,
# given here for an older sysroot, so that ddprun is linked without them.
file(STRINGS "${DDP_SYSROOT}/usr/include/features.h" _ddp_glibc_minor
     REGEX "^#define[ \t]+__GLIBC_MINOR__[ \t]+[0-9]+")
string(REGEX REPLACE ".*[ \t]([0-9]+)$" "\\1" _ddp_glibc_minor "${_ddp_glibc_minor}")
if(_ddp_glibc_minor LESS 36)
  set(DDP_LINKER_PACKS_RELATIVE_RELOCS OFF CACHE BOOL "glibc 2.${_ddp_glibc_minor} loads no DT_RELR")
endif()
