"""Routing load imbalance from first principles: the expected load of the
busiest expert-parallel rank over the mean when ``tokens`` tokens each pick
``top_k`` distinct experts uniformly at random among ``experts`` experts laid
``experts / ranks`` to a rank.

This is the load the step waits for when the router's choices behave like
independent uniform draws: DeepSeek-V3's auxiliary-loss-free balancing, a well
trained router under an auxiliary loss, or a random ("simulated perfect") gate
such as SGLang's random expert selection. A learned router's own skew comes on
top; a deterministic round-robin gate (NeMo Automodel's ``FakeBalancedGate``:
``arange(tokens * k) % experts``) is exactly balanced, 1.0 (the space's
``moe_imbalance`` override).

The model. One token sends X of its k picks to a given rank of u = E / e
experts: X is hypergeometric (k draws without replacement from E, u of them
the rank's) with

    mean k p,  variance k p q (E - k) / (E - 1),
    third cumulant k p q (1 - 2 p) (E - k) (E - 2 k) / ((E - 1) (E - 2)),

p = u / E = 1 / e, q = 1 - p (Johnson, Kemp & Kotz, "Univariate Discrete
Distributions", 3rd ed., section 6.3). A rank's load L is the sum over the N
tokens (cumulants times N); λ = N k / e is its mean. The e loads sum to N k,
each pair correlated -1 / (e - 1) (as in a multinomial); such exchangeable
normals are sqrt(e / (e - 1)) (W_i - mean W) for independent W_i, so

    E[max L] ~ λ + σ sqrt(e / (e - 1)) z_e,

z_e the expected maximum of e independent standard normals by Blom's formula
z_e = Φ⁻¹((e - 0.375) / (e + 0.25)) (G. Blom, "Statistical Estimates and
Transformed Beta-Variables", Wiley 1958; Harter, Biometrika 48 (1961) tables
the exact values: 1.4236 for 8, 2.4 for 64, which Blom's gives to < 1%), and
the skew of the count by the Cornish-Fisher term z -> z + (z² - 1) γ / 6
(Cornish & Fisher, Rev. Int. Stat. Inst. 5 (1938); γ = κ3 / σ³).

For small λ (decode batches spread over many ranks) the count's lattice and
skew are beyond a normal law (Monte-Carlo: 5.24 at λ = 0.5 where the normal
form gives 5.65), so for λ <= ``EXACT_MEAN_LOAD`` the count's distribution is
computed exactly (the hypergeometric pmf raised to the N-th power: N
convolutions, or J. C. P. Miller's recurrence for powers of a power series,
Henrici, "Applied and Computational Complex Analysis" vol. 1, 1974, section
1.6, when N exceeds the support kept) and E[max] of e independent such counts
is sum_m (1 - F(m)^e), its excess over λ scaled by the same sqrt(e / (e - 1)).
That branch is scaled by the ratio of the normal form to it at λ =
``EXACT_MEAN_LOAD`` so that the imbalance is continuous (and so monotone in
the tokens) where the branches meet; the ratio is within 1% of 1.

The result never exceeds the most a rank can hold: every token sending
min(k, u) rows to it, e min(k, u) / k times the mean.
tests/test_routing.py checks all of this against a seeded Monte-Carlo.
"""

from __future__ import annotations

import math

import numpy as np

from paraspace.kernels.jit import jit

#: mean rows per rank (λ = tokens * top_k / ranks) at and below which the load
#: distribution is computed exactly instead of by its normal approximation
EXACT_MEAN_LOAD = 8.0
#: rows per rank the exact branch's distribution keeps: at λ <= 8 the tail
#: beyond 64 rows is below 1e-20 (a Poisson(8) bound; the count is less
#: dispersed than a Poisson of its mean, its variance being λ q (E-k)/(E-1))
EXACT_SUPPORT = 64


@jit
def normal_quantile(p: float) -> float:
    """Φ⁻¹(p) for 0 < p < 1 - 1e-11 by Wichura's AS 241 (PPND16, Applied
    Statistics 37 (1988) 477-484; relative error about 1e-16). The third
    branch of AS 241 (1 - p < exp(-25)) is not needed: Blom's argument stays
    below it for any count of ranks below 4e10."""
    q = p - 0.5
    if abs(q) <= 0.425:
        r = 0.180625 - q * q
        num = (((((((2.5090809287301226727e3 * r + 3.3430575583588128105e4) * r + 6.7265770927008700853e4) * r
                   + 4.5921953931549871457e4) * r + 1.3731693765509461125e4) * r + 1.9715909503065514427e3) * r
                + 1.3314166789178437745e2) * r + 3.3871328727963666080e0)
        den = (((((((5.2264952788528545610e3 * r + 2.8729085735721942674e4) * r + 3.9307895800092710610e4) * r
                   + 2.1213794301586595867e4) * r + 5.3941960214247511077e3) * r + 6.8718700749205790830e2) * r
                + 4.2313330701600911252e1) * r + 1.0)
        return q * num / den
    r = p if q < 0.0 else 1.0 - p
    r = math.sqrt(-math.log(r)) - 1.6
    num = (((((((7.74545014278341407640e-4 * r + 2.27238449892691845833e-2) * r + 2.41780725177450611770e-1) * r
               + 1.27045825245236838258e0) * r + 3.64784832476320460504e0) * r + 5.76949722146069140550e0) * r
            + 4.63033784615654529590e0) * r + 1.42343711074968357734e0)
    den = (((((((1.05075007164441684324e-9 * r + 5.47593808499534494600e-4) * r + 1.51986665636164571966e-2) * r
               + 1.48103976427480074590e-1) * r + 6.89767334985100004550e-1) * r + 1.67638483018380384940e0) * r
            + 2.05319162663775882187e0) * r + 1.0)
    value = num / den
    return -value if q < 0.0 else value


@jit
def expected_max_normal(n: float) -> float:
    """Expected maximum of ``n`` independent standard normals, Blom's formula
    Φ⁻¹((n - 0.375) / (n + 0.25)) (0 for one)."""
    if n <= 1.0:
        return 0.0
    return normal_quantile((n - 0.375) / (n + 0.25))


@jit
def rank_capacity(experts: float, top_k: float, ranks: float) -> float:
    """The most a rank can receive over the mean: every token sending it
    min(k, E / e) rows, e * min(k, E / e) / k."""
    return ranks * min(top_k, experts / ranks) / top_k


@jit
def normal_imbalance(tokens: float, experts: float, top_k: float, ranks: float) -> float:
    """Busiest rank's load over the mean by the normal form with the
    Cornish-Fisher skew term (module doc), at most ``rank_capacity``."""
    e = ranks
    p = 1.0 / e
    q = 1.0 - p
    mean = tokens * top_k * p
    fpc = (experts - top_k) / (experts - 1.0)  # without replacement: 0 when a token picks every expert
    var = tokens * top_k * p * q * fpc
    if var <= 0.0:
        return 1.0
    z = expected_max_normal(e) * math.sqrt(e / (e - 1.0))
    if experts > 2.0:
        k3 = var * (1.0 - 2.0 * p) * (experts - 2.0 * top_k) / (experts - 2.0)
        z += (z * z - 1.0) * k3 / var ** 1.5 / 6.0
    return min(max(1.0, 1.0 + math.sqrt(var) * z / mean), rank_capacity(experts, top_k, ranks))


@jit
def token_count_pmf(experts: float, top_k: float, ranks: float) -> np.ndarray:
    """P(one token sends j of its k picks to a given rank), j = 0 .. min(k, u):
    hypergeometric C(u, j) C(E - u, k - j) / C(E, k), u = E / e (by lgamma, so
    a u that is not whole interpolates)."""
    u = experts / ranks
    d = int(min(top_k, math.floor(u)))
    out = np.zeros(d + 1)
    log_all = math.lgamma(experts + 1.0) - math.lgamma(top_k + 1.0) - math.lgamma(experts - top_k + 1.0)
    for j in range(d + 1):
        rest = top_k - j
        if experts - u < rest:
            continue
        out[j] = math.exp(math.lgamma(u + 1.0) - math.lgamma(j + 1.0) - math.lgamma(u - j + 1.0)
                          + math.lgamma(experts - u + 1.0) - math.lgamma(rest + 1.0)
                          - math.lgamma(experts - u - rest + 1.0) - log_all)
    return out


@jit
def load_pmf(tokens: int, a: np.ndarray, size: int) -> np.ndarray:
    """P(a rank receives m rows), m < ``size``, from ``tokens`` tokens with the
    per-token pmf ``a``: ``tokens`` convolutions when that is no more than the
    support kept, else Miller's recurrence for the power of a series,
    c_m = sum_j ((N + 1) j - m) a_j c_{m-j} / (m a_0), whose terms are all
    non-negative for m <= N + 1 (so no cancellation)."""
    d = a.shape[0] - 1
    c = np.zeros(size)
    if tokens <= size:
        c[0] = 1.0
        nxt = np.zeros(size)
        for _ in range(tokens):
            nxt[:] = 0.0
            for m in range(size):
                if c[m] == 0.0:
                    continue
                for j in range(min(d, size - 1 - m) + 1):
                    nxt[m + j] += c[m] * a[j]
            c[:] = nxt
        return c
    n = float(tokens)
    c[0] = a[0] ** n
    for m in range(1, size):
        acc = 0.0
        for j in range(1, min(m, d) + 1):
            acc += ((n + 1.0) * j - m) * a[j] * c[m - j]
        c[m] = acc / (m * a[0])
    return c


@jit
def exact_imbalance(tokens: int, experts: float, top_k: float, ranks: float) -> float:
    """Busiest rank's load over the mean from the exact load distribution of
    a rank (module doc): E[max of e] = sum_m P(max > m) = sum_m (1 - F(m)^e)
    for e independent loads, its excess over the mean scaled by
    sqrt(e / (e - 1)) for the loads' fixed sum; that sum also makes the
    busiest rank hold at least the mean, so P(max > m) = 1 below it (which
    an independent model misses when the tokens' rows are fewer than the
    ranks: one token's one row lands on some rank, max 1, not 1 - (1 - 1/e)^e).
    Two ranks are exact: E[max(X, N k - X)] over the one rank's load X (the
    independent form's step at the mean made it rise from an even token count
    to the next odd one)."""
    e = ranks
    mean = tokens * top_k / e
    c = load_pmf(tokens, token_count_pmf(experts, top_k, e), EXACT_SUPPORT)
    if e == 2.0:  # two ranks share the tokens' rows: the other holds the rest, exactly
        total = tokens * top_k
        e_max = 0.0
        for m in range(EXACT_SUPPORT):
            e_max += c[m] * max(float(m), total - m)
        return e_max / mean
    cdf = 0.0
    e_max = 0.0
    for m in range(EXACT_SUPPORT):
        cdf = min(1.0, cdf + c[m])
        e_max += 1.0 if m < mean else 1.0 - cdf ** e
    return 1.0 + max(0.0, e_max - mean) * math.sqrt(e / (e - 1.0)) / mean


@jit
def routing_imbalance(tokens: float, experts: float, top_k: float, ranks: float) -> float:
    """Expected load of the busiest of ``ranks`` expert-parallel ranks over the
    mean when ``tokens`` tokens each pick ``top_k`` distinct experts of
    ``experts`` uniformly at random (module doc); 1.0 for one rank, no
    experts or no tokens. Ranks beyond the experts count as the experts (a
    rank holds at least one expert)."""
    if ranks <= 1.0 or experts <= 0.0 or top_k <= 0.0 or tokens <= 0.0:
        return 1.0
    e = min(ranks, experts)
    k = min(top_k, experts)
    if e <= 1.0:
        return 1.0
    mean = tokens * k / e
    if mean > EXACT_MEAN_LOAD:
        return normal_imbalance(tokens, experts, k, e)
    n = max(1, int(round(tokens)))
    # the exact branch scaled to meet the normal form where they hand over
    n_edge = int(math.ceil(EXACT_MEAN_LOAD * e / k))
    edge_exact = exact_imbalance(n_edge, experts, k, e)
    scale = 1.0
    if edge_exact > 1.0:
        scale = (normal_imbalance(float(n_edge), experts, k, e) - 1.0) / (edge_exact - 1.0)
    value = 1.0 + (exact_imbalance(n, experts, k, e) - 1.0) * scale
    return min(max(value, 1.0), rank_capacity(experts, k, e))


@jit
def moe_imbalance(override: float, tokens: float, experts: float, top_k: float, ranks: float) -> float:
    """The busiest expert rank's load over the mean a kernel uses: ``override``
    when it is set (> 0: the space's fixed ``moe_imbalance``, 1.0 for a forced
    balanced gate), else ``routing_imbalance`` of the routed tokens."""
    if override > 0.0:
        return override
    return routing_imbalance(tokens, experts, top_k, ranks)


@jit(inline=True)
def layer_imbalance(sh, model, work) -> float:
    """``moe_imbalance`` of one training MoE layer of shape ``sh``
    (``kernels.shape``): a micro-batch's tokens of the EP x expert-TP group,
    sh.e * sh.et ranks each dispatching its 1/t share (sh.tokens / sh.t),
    routed over the sh.e ranks that hold the experts."""
    return moe_imbalance(work.moe_imbalance, sh.e * sh.et * sh.tokens / sh.t, model.experts, model.top_k, sh.e)
