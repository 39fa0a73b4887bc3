"""Training: update code (gradients, optimizers), compiled steps, the fit loop, data-parallel
training, communicators, checkpoints and data loaders. `einjit.train`, `einjit.fit`, `einjit.data`
and `einjit.checkpoint` are served from here by `einjit/__init__.py`."""
