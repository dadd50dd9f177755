"""PyTorch's own TCPStore server on 127.0.0.1 (port picked): 1.13's, or 2.x's (its libuv
server, the default since 2.4). Prints the port, then serves until killed."""
import datetime
import sys
import threading

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0, 1, True,
                      timeout=datetime.timedelta(seconds=300), wait_for_workers=False)
print(store.port, flush=True)
threading.Event().wait()
