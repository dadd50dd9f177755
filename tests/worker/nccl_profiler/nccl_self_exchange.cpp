// nccl_self_exchange [STEPS] [IDLE_S] [PAIRS]: a world of one on one GPU, STEPS groups of PAIRS
// ncclSend/ncclRecv to the rank itself (what an all_to_all issues for its own share; NCCL gives
// them no proxy work, so no kernel channel events), then IDLE_S seconds with nothing in flight.
// Under ddprun --hang_timeout=3 with its NCCL profiler plugin, a record the plugin never
// finished reads as a hang once the program idles (scripts/gpu-plugin-check runs it; issue 28).
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int idle = argc > 2 ? std::atoi(argv[2]) : 0;
  const int pairs = argc > 3 ? std::atoi(argv[3]) : 1;  // send/recv pairs per step
  cudaSetDevice(0);
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return 2;
  float *a = nullptr, *b = nullptr;
  cudaMalloc(&a, 4096 * sizeof(float));
  cudaMalloc(&b, 4096 * sizeof(float));
  cudaStream_t s;
  cudaStreamCreate(&s);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    ncclGroupStart();
    for (int p = 0; p < pairs; ++p) {
      ncclSend(a, 4096, ncclFloat, 0, comm, s);
      ncclRecv(b, 4096, ncclFloat, 0, comm, s);
    }
    if (ncclGroupEnd() != ncclSuccess) return 3;
  }
  cudaStreamSynchronize(s);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d steps of send/recv to itself, %.1f us a step\n", steps, us / steps);
  std::fflush(stdout);
  sleep(idle);
  ncclCommDestroy(comm);
  return 0;
}
