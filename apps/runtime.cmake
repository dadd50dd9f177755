# example programs and ddp-reducer-bench
