"""`import einjit.datasets`: the module moved to `einjit.demos.datasets`; this name is that module itself,
so `einjit.datasets`, `from einjit import datasets` and `import einjit.datasets` are one object."""

import sys

from einjit.demos import datasets as _moved

sys.modules[__name__] = _moved
