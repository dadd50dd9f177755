# ddprun and its sample workers
add_executable(ddprun ddprun.cpp)
target_link_libraries(ddprun PRIVATE ddp::launcher)
ddp_strict(ddprun)

# A worker for tests and the demo: dumps its environment, prints, fails, waits for signals.
add_executable(ddp-sample-worker ddp_sample_worker.cpp)
target_link_libraries(ddp-sample-worker PRIVATE ddp::store nlohmann_json::nlohmann_json)
ddp_strict(ddp-sample-worker)
