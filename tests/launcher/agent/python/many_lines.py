"""Writes N numbered lines, even ones to stdout and odd ones to stderr, one write each (python
-u, as ddprun and torchrun run scripts): through one pipe (2>&1) they must all arrive, in this
order. Used by tests/launcher/agent/pytorch_diagnosis_test.cpp."""
import sys

n = int(sys.argv[1])
for i in range(n):
    (sys.stdout if i % 2 == 0 else sys.stderr).write(f"line {i}\n")
