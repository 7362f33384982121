"""The motifs the generator draws: each adds a few temporaries in one stress pattern.

A motif reads operands from the generator's pool (inputs, states and earlier temporaries, so
temporaries end up shared across gates and states) and names its results with ``g.let``,
passing a magnitude bound that keeps values tame. ``finish`` adds the state updates and the
outputs. MOTIFS maps a name to ``(motif, weight)``.
"""

from __future__ import annotations

import numpy as np

from tests.fuzz.generator import LIMIT, Generator, Pooled
from tests.fuzz.spec import CellSpec, Expr, const, fn, slice_, var, walk


def _sum(terms: list[Expr], signs: list[int]) -> Expr:
    """``t0 + t1 - t2 ...`` left to right, as Python parses a written-out sum."""
    total = terms[0] if signs[0] > 0 else -terms[0]
    for t, s in zip(terms[1:], signs[1:], strict=True):
        total = total + t if s > 0 else total - t
    return total


def _activate(g: Generator, pre: Expr, n: int, bound: float) -> Pooled:
    """``pre`` through sigmoid, tanh, relu (when bounded) or nothing, named as a temporary."""
    kind = g.rng.integers(4)
    if kind == 0:
        return g.let(fn("sigmoid", pre), n, 1.0)
    if kind == 1:
        return g.let(fn("tanh", pre), n, 1.0)
    if kind == 2 and bound <= LIMIT:
        return g.let(fn("relu", pre), n, bound)
    return g.let(pre, n, bound)


def gate_family(g: Generator) -> None:
    """Two or three gates over the same operands, as in an LSTM or GRU (gate fusion's input):
    per gate ``src @ W + ... + b``, sometimes with the bias twice, the matmul twice, the bias
    first, a second bias (``b_ih + b_hh``), a matmul named once and used by two gates, or
    GRU's ``r * (h @ U + b)``."""
    n = g.width()
    sources = [g.pick(recent=g.chance(0.3)) for _ in range(int(g.rng.integers(1, 3)))]
    shared = g.let(sources[0].expr @ g.param((sources[0].width, n)), n,
                   sources[0].bound * sources[0].width * g.weight_bound) \
        if g.chance(0.3) else None
    gates = []
    for _ in range(int(g.rng.integers(2, 4))):
        terms, bound = [], 0.0
        for s in sources:
            terms.append(s.expr @ g.param((s.width, n), reuse=0.15))
            bound += s.bound * s.width * g.weight_bound
        if shared is not None:
            terms.append(shared.expr)
            bound += shared.bound
        b = g.param((n,), reuse=0.2)
        variant = g.rng.integers(7)
        if variant == 0:
            terms += [b, b]
        elif variant == 1:
            terms = [terms[0]] + terms + [b]
            bound += bound
        elif variant == 2:
            terms = [b] + terms
        elif variant == 3:
            terms += [b, g.param((n,))]
        elif variant == 4 and gates:
            r = gates[0]
            terms = terms[:-1] + [r.expr * (terms[-1] + b)]
            bound *= max(1.0, r.bound)
        else:
            terms.append(b)
        bound += 2.0 * g.weight_bound
        gates.append(_activate(g, _sum(terms, [1] * len(terms)), n, bound))


def classic_repeats(g: Generator) -> None:
    """The sums canonicalize has got wrong: ``x@W + b + b``, ``x@W + x@W + b``,
    ``x@W + b + h@U + b``, ``b + x@W + b``, ``(x@W + b) + (x@W + b)``, ``x@W - x@W + b``."""
    n = g.width()
    x, h = g.pick(), g.pick()
    xw = x.expr @ g.param((x.width, n))
    hu = h.expr @ g.param((h.width, n))
    b = g.param((n,))
    forms = [xw + b + b, xw + xw + b, xw + b + hu + b, b + xw + b, (xw + b) + (xw + b),
             xw - xw + b, xw + hu + xw + b + b, 2.0 * xw + b - b + b, xw + b + b + b]
    bound = 3.0 * (x.bound * x.width + h.bound * h.width + 3.0) * g.weight_bound
    _activate(g, g.choice(forms), n, bound)


def repeated_sum(g: Generator) -> None:
    """A long sum (3 to 8 terms, some subtracted) drawn with repeats from a few values, a
    bias, a matmul and a constant."""
    n = g.width()
    per_step = [g.operand(n) for _ in range(int(g.rng.integers(1, 3)))]
    v = g.pick()
    per_step.append(Pooled(v.expr @ g.param((v.width, n)), n, v.bound * v.width * g.weight_bound))
    fixed = [Pooled(g.param((n,)), n, g.weight_bound),
             Pooled(const(float(g.choice([0.5, 1.0, 2.0]))), 1, 2.0)]
    picks = [g.choice(per_step + fixed) for _ in range(int(g.rng.integers(3, 9)))]
    if not any(p in per_step for p in picks):
        picks[0] = per_step[0]  # at least one per-step term, so that the sum is (B, n)
    signs = [1 if g.chance(0.75) else -1 for _ in picks]
    if picks[0].expr.op == "const" and signs[0] < 0:
        signs[0] = 1
    _activate(g, _sum([p.expr for p in picks], signs), n, sum(p.bound for p in picks))


def concat_slices(g: Generator) -> None:
    """Slices of a concatenation (within a part, a whole part, across a boundary), or the
    gates of one matmul over ``concat([a, b])`` split by slices."""
    parts = [g.pick() for _ in range(int(g.rng.integers(2, 4)))]
    cat = fn("concat", *[p.expr for p in parts])
    total = sum(p.width for p in parts)
    bound = max(p.bound for p in parts)
    if g.chance(0.4):
        n, k = g.width(), int(g.rng.integers(2, 4))
        proj = cat @ g.param((total, n * k))
        pre = g.let(proj + g.param((n * k,)), n * k, bound * total * g.weight_bound + 1.0) \
            if g.chance(0.5) else Pooled(proj, n * k, bound * total * g.weight_bound)
        for j in range(k):
            _activate(g, slice_(pre.expr, j * n, (j + 1) * n), n, pre.bound)
        return
    base = g.let(cat, total, bound) if g.chance(0.5) else Pooled(cat, total, bound)
    edges = np.cumsum([0] + [p.width for p in parts])
    for _ in range(int(g.rng.integers(1, 4))):
        kind = g.rng.integers(3)
        if kind == 0:  # exactly one part
            j = int(g.rng.integers(len(parts)))
            start, stop = int(edges[j]), int(edges[j + 1])
        else:  # anywhere, often across a boundary
            start = int(g.rng.integers(total))
            stop = int(g.rng.integers(start + 1, total + 1))
        piece = slice_(base.expr, start, stop)
        if g.chance(0.3) and stop - start > 1:
            piece = slice_(piece, 1, stop - start)
            start += 1
        g.let(piece * const(g.choice([1.0, 0.5, -2.0])), stop - start, 2.0 * bound)


def reduction(g: Generator) -> None:
    """``mean`` and ``sum`` over features, broadcast back: centring, scaling, layer norm, a
    ``(B, 1)`` value times a parameter vector."""
    v = g.pick()
    n, b, m = v.width, v.bound, g.width()
    e = v.expr
    forms = [
        (e - fn("mean", e), n, 2 * b),
        (fn("sum", e) * 0.25, 1, b * n * 0.25),
        (e * fn("mean", e * e), n, b ** 3),
        (fn("mean", e) + fn("sum", e), 1, b * (n + 1)),
        (e / (1.0 + fn("mean", e * e)), n, b),
        (fn("sum", e - fn("mean", e)), 1, 2 * b * n),
        (fn("mean", e) * g.param((m,)), m, b * g.weight_bound),
        (g.param((m,)) - fn("sum", e) * 0.5, m, b * n * 0.5 + g.weight_bound),
    ]
    if g.chance(0.25):
        forms = [(fn("layer_norm", e, g.param((n,)), g.param((n,)), attr=(0.1,)), n,
                  (np.sqrt(n) + 1.0) * g.weight_bound)]
    g.let(*g.choice(forms))


def where(g: Generator) -> None:
    """``rnnc.where(c, a, b)`` with pooled, constant or parameter branches and shifted
    conditions."""
    c = g.pick()
    n = c.width if c.width > 1 or g.chance(0.5) else g.width()
    a, b = g.operand(n), g.operand(n)
    cond = c.expr - 0.25 if g.chance(0.3) else c.expr
    forms = [
        (fn("where", cond, a.expr, b.expr), max(a.bound, b.bound)),
        (fn("where", cond, a.expr, const(0.0)), a.bound),
        (fn("where", cond, a.expr, -a.expr), a.bound),
        (fn("where", cond, const(1.0), b.expr), max(1.0, b.bound)),
        (fn("where", cond, a.expr + b.expr, a.expr - b.expr), a.bound + b.bound),
        (fn("where", cond, a.expr, g.param((n,))), max(a.bound, g.weight_bound)),
        (fn("where", cond, g.param((n,)), g.param((n,))), g.weight_bound),
    ]
    expr, bound = g.choice(forms)
    g.let(expr, n, bound)


def constants(g: Generator) -> None:
    """One to three of: constants on either side and identities a rewrite may fold: ``2 - v``,
    ``v * 3``, ``1 - (1 - v)``, ``v + 0``, ``v * 1``, ``-(-v)``, ``(v * 2) * 0.5``, ``2v - v``."""
    v = g.pick()
    e, b = v.expr, v.bound
    for _ in range(int(g.rng.integers(1, 4))):
        forms = [
            (2.0 - e, b + 2), (e * 3.0, 3 * b), (1.0 - (1.0 - e), b + 2), (e + 0.0, b),
            (e * 1.0, b), (0.0 + e, b), (1.0 * e, b), (e - 0.0, b), (e / 2.0, b / 2),
            (Expr("neg", (-e,)), b), (-e, b), ((e * 2.0) * 0.5, b), ((e + 1.0) - 1.0, b + 1),
            (2.0 * e - e, 3 * b), (0.5 * e + 0.5 * e, b), (e - e + e, 3 * b),
            (3.0 * (e - 1.0), 3 * b + 3), (e * 0.0 + e, b), ((0.5 - e) * -2.0, 2 * b + 1),
            (-(1.0 - e) * e, b * (b + 1)), (1.0 - (1.0 - e), b + 2), (0.5 - (0.25 - e), b + 1),
        ]
        e, b = g.choice(forms)
    g.let(e, v.width, b)


def division(g: Generator) -> None:
    """Division by denominators kept away from zero."""
    a = g.pick()
    b = g.operand(a.width) if g.chance(0.7) else g.operand(1)
    forms = [
        (a.expr / (1.0 + fn("exp", fn("tanh", b.expr))), a.width, a.bound),
        (a.expr / (fn("sigmoid", b.expr) + 0.5), a.width, 2 * a.bound),
        (1.0 / (2.0 + fn("tanh", b.expr)), b.width, 1.0),
        (a.expr / 4.0, a.width, a.bound / 4),
        ((a.expr + b.expr) / (1.0 + b.expr * b.expr), a.width, a.bound + b.bound),
        (a.expr / fn("sqrt", b.expr * b.expr + 1.0), a.width, a.bound),
        (a.expr / (1.0 + g.param((a.width,)) * g.param((a.width,))), a.width, a.bound),
    ]
    g.let(*g.choice(forms))


def transcendental(g: Generator) -> None:
    """exp, log, sqrt and rsqrt on safe domains, and the composites softsign and
    hard_sigmoid."""
    v = g.pick()
    e, b = v.expr, v.bound
    forms = [
        (fn("exp", fn("tanh", e)), np.e), (fn("exp", -(e * e)), 1.0),
        (fn("log", 1.0 + e * e), float(np.log1p(b * b))),
        (fn("log", fn("sigmoid", e) + 0.5), 0.7), (fn("sqrt", e * e + 0.5), np.sqrt(b * b + 1)),
        (fn("rsqrt", e * e + 1.0), 1.0), (fn("softsign", e), 1.0), (fn("hard_sigmoid", e), 1.0),
        (fn("sqrt", fn("sigmoid", e) + 0.1), 1.05),
    ]
    if b <= 2.0:
        forms.append((fn("exp", e), float(np.exp(b))))
    expr, bound = g.choice(forms)
    g.let(expr, v.width, bound)


def param_only(g: Generator) -> None:
    """Expressions of parameters alone (hoisted out of the loop), combined with a step value;
    or a matmul by a scaled weight matrix."""
    v = g.pick()
    n = v.width
    if g.chance(0.25):
        w = g.param((n, n))
        g.let(v.expr @ (w * 0.5), n, v.bound * n * g.weight_bound * 0.5)
        return
    p = g.param((n,), reuse=0.5)
    q = g.choice([p * p, fn("tanh", p), p + p, fn("sigmoid", p) * 2.0, fn("exp", p), 1.0 - p])
    qb = 2.0 + 2.0 * g.weight_bound
    expr, bound = g.choice([(v.expr * q, v.bound * qb), (v.expr + q, v.bound + qb),
                            (q - v.expr, v.bound + qb), (v.expr * q + p, v.bound * qb + 1)])
    g.let(expr, n, bound)


def mix(g: Generator) -> None:
    """A convex gate mix ``f * a + (1 - f) * b`` (GRU's update)."""
    n = g.width()
    f = fn("sigmoid", g.operand(n).expr)
    a, b = g.operand(n), g.operand(n)
    g.let(f * a.expr + (1.0 - f) * b.expr, n, max(a.bound, b.bound))


def matmul_forms(g: Generator) -> None:
    """Matmuls of expressions: ``(a * b) @ W``, ``(a @ W1) @ W2``, ``a @ W + b @ W`` (one
    weight, two left operands), ``(a + b) @ W``, ``concat([a, b]) @ W``, ``a @ W1 + a @ W2``."""
    a = g.pick()
    k, n = a.width, g.width()
    b = g.operand(k)
    wb = g.weight_bound
    kind = g.rng.integers(6)
    if kind == 0:
        g.let((a.expr * b.expr) @ g.param((k, n)), n, a.bound * b.bound * k * wb)
    elif kind == 1:
        m = int(g.rng.integers(1, 5))
        g.let((a.expr @ g.param((k, m))) @ g.param((m, n)), n, a.bound * k * m * wb * wb)
    elif kind == 2:
        w = g.param((k, n))
        g.let(a.expr @ w + b.expr @ w, n, (a.bound + b.bound) * k * wb)
    elif kind == 3:
        g.let((a.expr + b.expr) @ g.param((k, n)), n, (a.bound + b.bound) * k * wb)
    elif kind == 4:
        g.let(fn("concat", a.expr, b.expr) @ g.param((2 * k, n)), n,
              max(a.bound, b.bound) * 2 * k * wb)
    else:
        g.let(a.expr @ g.param((k, n)) + a.expr @ g.param((k, n)), n, 2 * a.bound * k * wb)


def binary(g: Generator) -> None:
    """Plain elementwise glue between pooled values (broadcasting (B, 1) values too)."""
    a = g.pick()
    b = g.operand(a.width) if g.chance(0.8) else g.operand(1)
    if g.chance(0.5):  # the (B, 1) operand first as often as second
        a, b = b, a
    op = g.rng.integers(3)
    expr = (a.expr + b.expr, a.expr - b.expr, a.expr * b.expr)[op]
    bound = a.bound * b.bound if op == 2 else a.bound + b.bound
    g.let(expr, max(a.width, b.width), bound)


MOTIFS = {
    "gate_family": (gate_family, 3.0), "classic_repeats": (classic_repeats, 2.0),
    "repeated_sum": (repeated_sum, 2.0), "concat_slices": (concat_slices, 1.5),
    "reduction": (reduction, 1.5), "where": (where, 1.0), "constants": (constants, 2.0),
    "division": (division, 1.0), "transcendental": (transcendental, 1.0),
    "param_only": (param_only, 1.0), "mix": (mix, 1.0), "matmul_forms": (matmul_forms, 1.5),
    "binary": (binary, 1.0),
}


# ---------------------------------------------------------------- updates and outputs


def _update(g: Generator, name: str, n: int) -> Expr:
    """The next value of state ``name``: bounded by construction."""
    state = var(name)
    same = [s for s, w in g.states if w == n and s != name]
    if g.chance(0.04) and same:
        return var(g.choice(same))  # a swap or rotation of states
    if g.chance(0.03):
        return state  # a state that never changes
    v = g.width_of(g.pick(recent=g.chance(0.7)), n)
    kind = g.rng.integers(4)
    if kind == 0:
        expr = fn("tanh", v.expr)
    elif kind == 1:
        z = fn("sigmoid", g.operand(n, recent=True).expr)
        expr = z * state + (1.0 - z) * fn("tanh", v.expr)
    elif kind == 2:
        expr = fn("where", g.operand(n).expr, fn("tanh", v.expr), state)
    else:
        expr = v.expr if v.bound <= 1.0 else fn("tanh", v.expr)
    return g.let(expr, n, 1.0).expr


def finish(g: Generator) -> CellSpec:
    """Add the state updates and one to three outputs; return the spec."""
    updates: dict[str, Expr] = {}
    for name, n in g.states:
        updates[name] = _update(g, name, n)
    # Outputs rescue temporaries nothing else reads, so that more of what was drawn is live.
    used = {n.attr[0] for _, e in g.lets + list(updates.items()) for n in walk(e)
            if n.op == "var"}
    unread = [v for v in g.pool if v.expr.op == "var" and v.expr.attr[0] not in used
              and v.expr.attr[0].startswith("t")]
    outputs = []
    for k in range(int(g.rng.choice([1, 2, 2, 3]))):
        r = g.rng.random()
        if r < 0.25:
            expr = g.choice(list(updates.values()))  # a new state
        elif r < 0.32:
            expr = var(g.choice(g.inputs + g.states)[0])  # an input or a previous state
        elif r < 0.37 and outputs:
            expr = outputs[0][1]  # the same value twice
        elif unread:
            expr = unread.pop(int(g.rng.integers(len(unread)))).expr  # not a state
        else:
            expr = g.pick(recent=g.chance(0.5)).expr
        outputs.append((f"y{k}", expr))
    return CellSpec(tuple(g.inputs), tuple(g.states), tuple(g.params), tuple(g.lets),
                    tuple(updates.items()), tuple(outputs))
