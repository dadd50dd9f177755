#pragma once
// The NCCL profiler plugin interface, as far as ddprun's plugin uses it: our own declarations,
// written from NCCL's documentation (plugins/profiler/README.md) and its headers of the
// interface, NVIDIA/nccl 2.30.7 (src/include/plugin/nccl_profiler.h and
// src/include/plugin/profiler/profiler_v3.h ... profiler_v6.h; the same files as
// ext-profiler/example/nccl/ in older releases). NCCL looks the plugin up by dlsym of
// "ncclProfiler_v<N>", newest first: v3 since NCCL 2.26, v4 since 2.27, v5 since 2.28, v6
// since 2.29 (v1 and v2, NCCL 2.23-2.25, have no kernel events: a collective's end cannot be
// seen there, so we do not offer them).
//
// Only what the plugin reads is declared. NCCL builds the descriptors and we only read them,
// so a union may list fewer members than NCCL's (theirs is larger; the members we declare
// sit at the same offsets). C layout: these cross a C ABI.

#include <cstddef>
#include <cstdint>

namespace ddp::nccl_profiler {

// ncclResult_t (nccl.h): the plugin only ever returns success.
using Result = int;
inline constexpr Result kSuccess = 0;

// ncclDebugLogger_t (nccl.h): NCCL's logger, handed to init (v4+); unused.
using DebugLogger = void (*)(int level, unsigned long flags, const char* file, int line,
                             const char* fmt, ...);

// Event types (nccl_profiler.h): the bits of the activation mask and each descriptor's type.
inline constexpr std::uint64_t kProfileGroup = 1u << 0;
inline constexpr std::uint64_t kProfileColl = 1u << 1;  // one collective of a kernel plan
inline constexpr std::uint64_t kProfileP2p = 1u << 2;   // one send or receive
inline constexpr std::uint64_t kProfileProxyOp = 1u << 3;
inline constexpr std::uint64_t kProfileProxyStep = 1u << 4;
inline constexpr std::uint64_t kProfileProxyCtrl = 1u << 5;
inline constexpr std::uint64_t kProfileKernelCh = 1u << 6;  // a kernel's work on one channel
inline constexpr std::uint64_t kProfileNetPlugin = 1u << 7;

// ncclProfilerEventState_t: recordEventState's states; the one kernel state we see.
inline constexpr int kStateKernelChStop = 22;

// --- v3 (profiler_v3.h, NCCL 2.26) -----------------------------------------------------
struct EventDescrV3 {
  std::uint8_t type;  // kProfile*
  void* parentObj;    // the parent event's handle (a kernelCh's: its collective's)
  int rank;
  union {
    struct {
      const char* name;
      std::uint64_t commHash;
      std::uint64_t seqNumber;  // per communicator and function
      const char* func;         // "AllReduce", "Broadcast", ... (ncclFuncToString)
      const void* sendBuff;
      void* recvBuff;
      std::size_t count;
      int root;
      const char* datatype;  // "ncclFloat32", ... (ncclDatatypeToString)
      std::uint8_t nMaxChannels;
      std::uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* name;
      std::uint64_t commHash;
      const char* func;  // "Send" / "Recv"
      void* buff;
      const char* datatype;
      std::size_t count;
      int peer;
    } p2p;
    struct {
      std::uint8_t channelId;
    } kernelCh;
  };
};

// --- v4 (profiler_v4.h, NCCL 2.27): no name/commHash in coll and p2p -------------------
struct EventDescrV4 {
  std::uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      std::uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      std::size_t count;
      int root;
      const char* datatype;
      std::uint8_t nChannels;  // the channels the collective runs on: one kernelCh event each
      std::uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      std::size_t count;
      int peer;
      std::uint8_t nChannels;
    } p2p;
    struct {
      std::uint8_t channelId;
      std::uint64_t pTimer;
    } kernelCh;
  };
};

// --- v5 (profiler_v5.h, NCCL 2.28) and v6 (profiler_v6.h, NCCL 2.29): type is 64 bits,
// coll and p2p gain parentGroup; v6 adds copy-engine members to the union (not read here).
struct EventDescrV5 {
  std::uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      std::uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      std::size_t count;
      int root;
      const char* datatype;
      std::uint8_t nChannels;
      std::uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      std::size_t count;
      int peer;
      std::uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      std::uint8_t channelId;
      std::uint64_t pTimer;
    } kernelCh;
  };
};

// recordEventState's arguments (a union in every version); never read here.
union EventStateArgs {
  struct {
    std::uint64_t pTimer;
  } kernelCh;
  unsigned char bytes[16];
};

// The exported structs: ncclProfiler_v3_t ... ncclProfiler_v6_t.
struct ProfilerV3 {
  const char* name;
  Result (*init)(void** context, int* eActivationMask);
  Result (*startEvent)(void* context, void** eHandle, EventDescrV3* eDescr);
  Result (*stopEvent)(void* eHandle);
  Result (*recordEventState)(void* eHandle, int eState, EventStateArgs* eStateArgs);
  Result (*finalize)(void* context);
};

struct ProfilerV4 {
  const char* name;
  Result (*init)(void** context, int* eActivationMask, const char* commName, std::uint64_t commHash,
                 int nNodes, int nranks, int rank, DebugLogger logfn);
  Result (*startEvent)(void* context, void** eHandle, EventDescrV4* eDescr);
  Result (*stopEvent)(void* eHandle);
  Result (*recordEventState)(void* eHandle, int eState, EventStateArgs* eStateArgs);
  Result (*finalize)(void* context);
};

// v5 and v6 share this layout (v6's descriptor is v5's with more union members).
struct ProfilerV5 {
  const char* name;
  Result (*init)(void** context, std::uint64_t commId, int* eActivationMask, const char* commName,
                 int nNodes, int nranks, int rank, DebugLogger logfn);
  Result (*startEvent)(void* context, void** eHandle, EventDescrV5* eDescr);
  Result (*stopEvent)(void* eHandle);
  Result (*recordEventState)(void* eHandle, int eState, EventStateArgs* eStateArgs);
  Result (*finalize)(void* context);
};

// The symbols NCCL looks up (plugin/profiler/profiler_v<N>.cc).
inline constexpr const char* kSymbolV3 = "ncclProfiler_v3";
inline constexpr const char* kSymbolV4 = "ncclProfiler_v4";
inline constexpr const char* kSymbolV5 = "ncclProfiler_v5";
inline constexpr const char* kSymbolV6 = "ncclProfiler_v6";

// The plugin's file name, and its name in NCCL's log.
inline constexpr const char* kPluginFileName = "libddprun-nccl-profiler.so";
inline constexpr const char* kPluginName = "ddprun";

}  // namespace ddp::nccl_profiler
