"""Loop scheduling for the CPU: contraction and convolution blocking, loop interchange, perfect
nests, the cost model and the measured search over tiles (its timer is given by the backend layer)."""
