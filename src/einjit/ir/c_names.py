"""The C identifier of a routine: its name, unless that name would not compile or would clash.

A routine becomes a function of the generated file, next to `math.h`, `stdlib.h`, `string.h`
and einjit's own helpers (`einjit_uniform01`, `EINJIT_CLAMP`...), and for CUDA compiled as C++ beside the
device runtime. A routine called `exp`, `free`, `int` or `class` would redeclare one of those,
so such names are mangled: a trailing `_` (`exp_`); names starting with `_` (reserved to the
implementation) get a leading `r` instead (`r_x`). No reserved name ends in `_` or `_body`, so
`c_name(name) + suffix` is its own C name (the C backend's `NAME_body` functions rely on it).

A routine's name is the user's text, and it reaches generated code, compiler messages and file
names (`EINJIT_DUMP_DIR`, kept sources). `routine_name` reduces it to a plain ASCII identifier
of at most `MAX_NAME` characters before anything uses it: a name that is one already is kept,
any other gets its safe characters and a hash of the original, so two different names stay
different and `../escaped` can neither leave a directory nor end a C comment.
"""

from __future__ import annotations

import hashlib
import re

_C_KEYWORDS = """
    auto break case char const continue default do double else enum extern float for goto if inline int long
    register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
    alignas alignof bool constexpr false nullptr static_assert thread_local true typeof typeof_unqual
"""
_CXX_KEYWORDS = """
    and and_eq asm bitand bitor catch char8_t char16_t char32_t class co_await co_return co_yield compl concept
    const_cast consteval constinit decltype delete dynamic_cast explicit export friend mutable namespace new
    noexcept not not_eq operator or or_eq private protected public reinterpret_cast requires static_cast template
    this throw try typeid typename using virtual wchar_t xor xor_eq
"""
_LIBM = """
    acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh drem erf erfc exp exp10 exp2 expm1 fabs fdim
    finite floor fma fmax fmin fmod frexp gamma hypot ilogb j0 j1 jn ldexp lgamma llrint llround log log10 log1p log2
    logb lrint lround modf nan nearbyint nextafter nexttoward pow pow10 remainder remquo rint round scalb scalbln
    scalbn significand sin sincos sinh sqrt tan tanh tgamma trunc y0 y1 yn
    fpclassify isfinite isgreater isgreaterequal isinf isless islessequal islessgreater isnan isnormal isunordered
    signbit float_t double_t HUGE_VAL HUGE_VALF INFINITY NAN
"""
_LIBC = """
    main abort abs atexit atof atoi atol atoll bsearch calloc div exit free getenv labs ldiv llabs lldiv malloc qsort
    rand realloc srand strtod strtof strtol strtoll strtoul system memchr memcmp memcpy memmove memset strcat strchr
    strcmp strcpy strcspn strdup strerror strlen strncat strncmp strncpy strpbrk strrchr strspn strstr strtok
    errno size_t ptrdiff_t div_t ldiv_t NULL EXIT_FAILURE EXIT_SUCCESS RAND_MAX
"""
_CUDA = "min max printf atomicAdd blockIdx blockDim gridDim threadIdx warpSize"
_EINJIT = "einjit_uniform01 einjit_grid_sync EINJIT_CLAMP EINJIT_SIMD EINJIT_TID EINJIT_NTHREADS EINJIT_INT_MATH"

RESERVED: frozenset[str] = frozenset(" ".join([_C_KEYWORDS, _CXX_KEYWORDS, _LIBM, _LIBC, _CUDA, _EINJIT]).split())
"""Names a routine may not take as they are; each libm function's `f` and `l` variants too."""

_LIBM_VARIANTS = frozenset(f"{n}{s}" for n in _LIBM.split() if n.islower() for s in ("f", "l"))


def is_reserved(name: str) -> bool:
    return name in RESERVED or name in _LIBM_VARIANTS


def c_name(name: str) -> str:
    """The identifier the generated C uses for a routine named `name` (already an identifier)."""
    if name.startswith("_"):
        return "r" + name
    return name + "_" if is_reserved(name) else name


MAX_NAME = 80
"""The longest routine name kept as given: longer ones are cut and hashed, so a file name made
from a routine name (`<name>.optimized.ll`) stays far below the usual 255-byte limit."""

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def routine_name(name: str) -> str:
    """The name einjit uses for a routine the user called `name`: `name` itself when it is an
    ASCII identifier of at most `MAX_NAME` characters, else its letters, digits and `_` (cut
    to fit) followed by `_h` and 10 hex digits of the original's SHA-256."""
    if _PLAIN.match(name) and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    clean = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")[:MAX_NAME - 13]
    if not clean[:1].isalpha():
        clean = "routine" + ("_" + clean if clean else "")
    return f"{clean}_h{digest}"
