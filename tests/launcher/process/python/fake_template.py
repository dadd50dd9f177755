"""A stand-in for ddprun's warm template (worker/python/_ddprun_template.py) that speaks its
protocol (common/include/ddp/common/worker_contract.hpp) the way a test asks, for
worker_template_test.cpp: fake_template.py MODE, with DDPRUN_TEMPLATE_FD as ddprun gives it.

- answer: each prepare gets {"op": "prepared", "modules": 5, "seconds": 0.25}; each spawn
  {"op": "cold", "reason": "the fake forks nothing"}
- refuse: prepare answers with a problem (the template must not fork)
- silent: reads requests and never answers
- garbage: answers "not json"
- exit: exits at the first request
"""

import json
import os
import socket
import sys


def main():
    mode = sys.argv[1]
    control = socket.socket(fileno=int(os.environ["DDPRUN_TEMPLATE_FD"]))
    while True:
        data = control.recv(1 << 20)
        if not data:
            return
        if mode == "exit":
            return
        if mode == "silent":
            continue
        if mode == "garbage":
            control.send(b"not json")
            continue
        request = json.loads(data)
        if request["op"] == "prepare":
            reply = {"op": "prepared", "modules": 5, "seconds": 0.25, "problem": None}
            if mode == "refuse":
                reply["problem"] = "an import started a thread"
            control.send(json.dumps(reply).encode())
        elif request["op"] == "spawn":
            control.send(json.dumps({"op": "cold", "reason": "the fake forks nothing"}).encode())


if __name__ == "__main__":
    main()
