"""The C backend on the CPU: the gcc toolchain, the backend (contexts, routines, devices) and the
multicore backend that runs one C device per core."""
