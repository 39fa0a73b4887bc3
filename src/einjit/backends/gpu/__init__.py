"""GPU backends: CUDA (renderer, driver bindings, backend)."""
