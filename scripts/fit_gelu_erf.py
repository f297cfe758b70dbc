"""The coefficients of the exact (erf) GELU in csrc/include/triforce/glu.h, and their float32 error.

GELU(x) = x * Phi(x), Phi the standard normal's distribution function. With a = |x|:
  Phi(x) = Q (x < 0) or 1 - Q, Q = e^(-a^2/2) * R(t), t = 3 / (3 + a)   (R: degree 11, fitted to Q(a) e^(a^2/2))
Q(a) = erfc(a / sqrt 2) / 2 is the upper tail (1/2 at 0), so the negative side (Phi = Q) has no cancellation and the
positive one none either (1 - Q >= 1/2). The fit is a least-squares fit of the relative error at Chebyshev points of
[0, 13.25] (40-digit mpmath values), rounded to float32. Run
`python scripts/fit_gelu_erf.py` to print the C++ constants and the worst error of the float32 evaluation (each
step rounded to float32, as the kernel's; e^x exact here) against mpmath, in ulp of the result.
"""
import numpy as np
from mpmath import erfc, exp, mp, mpf, sqrt

mp.dps = 40
TOP, C, DEGREE = 13.25, 3.0, 11  # (e^(-a^2/2) is under float's smallest normal from a = 13.22 on: Q = 0 there)
f32 = np.float32


def tail_ratio(a):  # Q(a) e^(a^2/2)
    a = mpf(a)
    return float(erfc(a / sqrt(2)) / 2 * exp(a * a / 2))


def fit(x, y, degree):
    V = np.vander(x, degree + 1)
    coef, *_ = np.linalg.lstsq(V / y[:, None], np.ones_like(y), rcond=None)
    return coef.astype(f32)


def chebyshev(lo, hi, n=3000):
    return np.cos(np.linspace(0, np.pi, n)) * (hi - lo) / 2 + (hi + lo) / 2


def fma(a, b, c):
    return f32(np.float64(a) * np.float64(b) + np.float64(c))


def horner(coef, x):
    p = coef[0]
    for k in coef[1:]:
        p = fma(p, x, k)
    return p


def gelu(x, R):
    x = f32(x)
    a = f32(abs(x))
    hi = f32(a * a)
    lo = fma(a, a, -hi)
    e = f32(np.exp(np.float64(f32(-0.5) * hi)))
    e = fma(e, f32(f32(-0.5) * lo), e)
    q = f32(e * horner(R, f32(f32(C) / f32(f32(C) + a)))) if a < TOP else f32(0)
    return f32(x * (q if x < 0 else f32(f32(1) - q)))


def main():
    a = chebyshev(0, TOP)
    R = fit(C / (C + a), np.array([tail_ratio(v) for v in a]), DEGREE)
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-13.2, 13.2, 20000), rng.normal(0, 1, 20000), rng.uniform(-1.2, 1.2, 5000)])
    worst = 0.0
    for x in xs.astype(f32):
        want = mpf(float(x)) * erfc(-mpf(float(x)) / sqrt(2)) / 2
        if abs(want) < 1e-36:  # (subnormal results: ulp is no measure there)
            continue
        worst = max(worst, abs(float(gelu(x, R)) - float(want)) / float(np.spacing(f32(abs(float(want))))))
    print(f"constexpr float kGeluTail[{len(R)}] = {{" + ", ".join(f"{float(c):.9g}f" for c in R) + "};")
    print(f"worst error of the float32 evaluation: {worst:.2f} ulp")


if __name__ == "__main__":
    main()
