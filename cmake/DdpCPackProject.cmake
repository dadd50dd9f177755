# Read by cpack as it starts (CPACK_PROJECT_CONFIG_FILE, set by cmake/DdpPackage.cmake for a
# build against a sysroot): dpkg-shlibdeps, which fills the ddprun package's Depends, reads the
# symbols files of the sysroot's dpkg database, those of the glibc the programs were linked
# against, instead of this host's.
if(CPACK_DDP_DPKG_ADMINDIR)
  set(ENV{DPKG_ADMINDIR} "${CPACK_DDP_DPKG_ADMINDIR}")
endif()
