"""`import einjit.checkpoint`: the module moved to `einjit.training.checkpoint`; this name is that module itself,
so `einjit.checkpoint`, `from einjit import checkpoint` and `import einjit.checkpoint` are one object."""

import sys

from einjit.training import checkpoint as _moved

sys.modules[__name__] = _moved
