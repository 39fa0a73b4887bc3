"""Image and sparse ATL programs shared by the Halide and einjit backend tests."""

from __future__ import annotations

from einjit.atl import B, Func, Gen, Idx, Let, R, Rel, Sum, TTensor, Var

H, W = 13, 17
img, bx = Var("img"), Var("bx")
i, j = Idx("i"), Idx("j")


def blur_func() -> Func:
    """A separable 3-tap blur, zero outside the image: every off-centre tap is guarded."""
    blur_x = Gen(i, H, Gen(j, W, 0.25 * ((j - 1 >= 0) * img[i, j - 1] + 2 * img[i, j]
                                         + (j + 1 < W) * img[i, j + 1])))
    blur_y = Gen(i, H, Gen(j, W, 0.25 * ((i - 1 >= 0) * bx[i - 1, j] + 2 * bx[i, j]
                                         + (i + 1 < H) * bx[i + 1, j])))
    return Func([("img", TTensor(H, TTensor(W, R)))], Let("bx", blur_x, blur_y))


def laplacian_func() -> Func:
    neighbours = ((i - 1 >= 0) * img[i - 1, j] + (i + 1 < H) * img[i + 1, j]
                  + (j - 1 >= 0) * img[i, j - 1] + (j + 1 < W) * img[i, j + 1])
    return Func([("img", TTensor(H, TTensor(W, R)))],
                Gen(i, H, Gen(j, W, neighbours - 4.0 * img[i, j])))


def masked_matvec_func(n: int = 7, m: int = 5) -> Func:
    A, x = Var("A"), Var("x")
    return Func([("M", TTensor(n, TTensor(m, B))), ("A", TTensor(n, TTensor(m, R))),
                 ("x", TTensor(m, R))],
                Gen(i, n, Sum(j, m, Rel("M", i, j) * (A[i, j] * x[j]))))
