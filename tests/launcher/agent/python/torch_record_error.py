"""Rank 1 raises inside torchelastic's @record, which writes the JSON error file named by
TORCHELASTIC_ERROR_FILE; rank 0 exits cleanly."""
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one gave up")


main()
