# ddprun and its sample workers
