"""ddprun's Python package: what a training program may import from ddprun.

- ``ddprun.inplace``: in-place recovery under ``ddprun --restart_policy=inplace`` (docs/inplace.md).

It imports nothing at start-up: a program that does not import it is untouched.
"""
