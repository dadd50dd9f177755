// What our code uses from glibc 2.32+ and Linux 5.11+ headers, for a build against an older
// glibc (the packages: Debian 11's glibc 2.31, cmake/DdpSysroot.cmake). Included before every
// C++ file of a DDP_PORTABLE build (CMakeLists.txt); empty where the headers have it all.
// packaging/glibc_compat.cpp defines the functions declared here, for the packaged programs.
#pragma once

#include <features.h>
#include <stddef.h>
#include <sys/syscall.h>
#if __has_include(<linux/close_range.h>)
#include <linux/close_range.h>
#endif

#if !__GLIBC_PREREQ(2, 32)
// glibc 2.32+ (<string.h>): "TERM" for SIGTERM; null for a number that names no signal.
extern "C" const char* sigabbrev_np(int signal) noexcept;
#endif

#ifndef SYS_close_range
#define SYS_close_range 436  // Linux 5.9; one number on every architecture
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)  // Linux 5.11: mark close-on-exec instead of closing
#endif

// Fills `size` bytes with random bits from the kernel: getrandom, or /dev/urandom (once the
// kernel's pool is seeded) where the getrandom system call is missing (ENOSYS: Linux before
// 3.17, or a seccomp filter that does not know it), as glibc's arc4random does. Never fails:
// aborts without a source. Defined in glibc_compat.cpp, for its arc4random (and its test).
extern "C" __attribute__((visibility("hidden"))) void ddp_compat_random_bytes(void* buffer,
                                                                              size_t size) noexcept;
