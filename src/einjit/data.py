"""`import einjit.data`: the module moved to `einjit.training.data`; this name is that module itself,
so `einjit.data`, `from einjit import data` and `import einjit.data` are one object."""

import sys

from einjit.training import data as _moved

sys.modules[__name__] = _moved
