# A job whose rank 1 raises (no @record of its own): under ddprun's --run_path and -m the
# worker's error file still gets the traceback.
import os


def give_up():
    raise ValueError("rank one gave up")


if __name__ == "__main__":
    if os.environ["RANK"] == "1":
        give_up()
