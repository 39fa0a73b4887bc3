"""`import einjit.train`: the module moved to `einjit.training.train`; this name is that module itself,
so `einjit.train`, `from einjit import train` and `import einjit.train` are one object."""

import sys

from einjit.training import train as _moved

sys.modules[__name__] = _moved
