// The smallest libddp program: every rank contributes ones; each prints sum=<world size>.
//   ddprun --nproc_per_node=3 build/bin/ddp-example-sum
#include <cstdio>
#include <ddp/runtime.hpp>
#include <vector>
int main() {
  ddp::Context ctx = ddp::init();
  std::vector<float> v(1000, 1.0f);
  ctx.allreduce(std::span<float>(v), ddp::ReduceOp::Sum);
  ctx.barrier();
  std::printf("rank=%d world=%d sum=%g\n", ctx.rank(), ctx.world_size(), v[999]);
}
