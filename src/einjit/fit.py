"""`import einjit.fit`: the module moved to `einjit.training.fit`; this name is that module itself,
so `einjit.fit`, `from einjit import fit` and `import einjit.fit` are one object."""

import sys

from einjit.training import fit as _moved

sys.modules[__name__] = _moved
