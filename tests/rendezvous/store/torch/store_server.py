"""PyTorch 1.13's own TCPStore server on 127.0.0.1 (port picked). Prints the port, then
serves until killed."""
import datetime
import sys
import threading

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0, 1, True,
                      timeout=datetime.timedelta(seconds=300), wait_for_workers=False)
print(store.port, flush=True)
threading.Event().wait()
