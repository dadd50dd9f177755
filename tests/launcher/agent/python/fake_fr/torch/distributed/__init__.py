"""A stand-in for PyTorch's package, only so that the Flight Recorder analyser below can be
found (tests/launcher/agent/hang_test.cpp): PyTorch 1.13 has no analyser to run."""
