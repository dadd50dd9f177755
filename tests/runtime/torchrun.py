# torchrun from python3-torch 1.13, with its --redirects/--tee parser fixed for Python 3.11
# (Std is an IntFlag there, and iterating it skips Std.NONE, so "0" parsed to None).
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(vm):
    if re.fullmatch(r"[0-3]", vm):
        return api.Std(int(vm))
    return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}


api.Std.from_str = staticmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "torchrun"
    main()
