# ddpstore and ddpstore-bench
