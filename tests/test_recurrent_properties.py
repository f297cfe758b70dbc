"""The three recurrent scans of the caches (``ssm_scan``: Mamba-2, ``delta_scan``: gated DeltaNet, ``selective_scan``:
Mamba(-1)), as properties over drawn shapes, values and per-row counts, for each path a process may take: the
extension's kernel where built (csrc/cpu/{ssm,delta,selective}.cpp) and PyTorch's ops (its switch at 0).

Each draw checks what the model layer relies on: the recurrence, in float64, within float32's rounding of the values
drawn; a call over T tokens bitwise the same as two calls split anywhere (a verify pass is its steps; a replay is the
forwards it replays); a row bitwise the same alone as in a batch (the rows of a batch never meet); a row's count (0 to
T) leaves the tokens past it out of its state, and a replay (no readout) moves the state as the readout call does.
The shapes straddle the kernels' blocking: the vector path's 16 state dims, the 32-channel and 64-column blocks, key
heads shared by several value heads, B groups shared by several heads, a single token, none; the delta rule's decay one
per head (gated DeltaNet's) or one per key channel (Kimi's KDA)."""
import contextlib

import torch
from hypothesis import example, given, strategies as st

from triforce.models import cache as cache_mod
from triforce.models.cache import delta_scan, selective_scan, ssm_scan

PATHS = ("kernel", "torch")


@contextlib.contextmanager
def path(op: str, which: str):
    """The scan ``op`` through the extension's kernel (``which == "kernel"``, where built: else PyTorch's ops, as a
    process without it runs) or PyTorch's ops (``"torch"``: as its switch at 0)."""
    saved = cache_mod._CACHE_OPS.get(op, "unset")
    cache_mod._CACHE_OPS.pop(op, None)
    if which == "torch":
        cache_mod._CACHE_OPS[op] = None
    try:
        yield
    finally:
        cache_mod._CACHE_OPS.pop(op, None)
        if saved != "unset":
            cache_mod._CACHE_OPS[op] = saved


def close(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor):
    """``got`` (float32) within float32's rounding of ``want`` (float64): a few ulps of the magnitudes ``scale`` that
    the sums run through, per element, times the tokens' depth."""
    assert got.shape == want.shape and got.dtype == torch.float32
    err = (got.double() - want).abs()
    bound = 1e-5 * (1 + scale)
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}, at bound {bound.flatten()[err.argmax()]}"


def _rows(b: int, T: int, data) -> torch.Tensor:
    return torch.tensor(data.draw(st.lists(st.integers(0, T), min_size=b, max_size=b), label="counts"))


def check_invariances(scan, state, inputs, readout, counts, T):
    """The bitwise properties shared by the three scans. ``scan(state, inputs, readout, counts)`` runs one call;
    ``inputs`` and ``readout`` are tuples of ``[b, T, ...]`` tensors (``readout`` None: a replay)."""
    full_state = state.clone()
    y = scan(full_state, inputs, readout, None)
    # split anywhere: the first call's state carried into the second
    for cut in {0, T // 2, T}:
        part = state.clone()
        first = scan(part, tuple(t[:, :cut] for t in inputs), tuple(t[:, :cut] for t in readout), None)
        second = scan(part, tuple(t[:, cut:] for t in inputs), tuple(t[:, cut:] for t in readout), None)
        assert torch.equal(torch.cat([first, second], 1), y) and torch.equal(part, full_state)
    # a replay moves the state alike
    replay = state.clone()
    assert scan(replay, inputs, None, None) is None and torch.equal(replay, full_state)
    # per-row counts; each row alone as in the batch
    counted = state.clone()
    y_counted = scan(counted, inputs, readout, counts)
    replayed = state.clone()
    scan(replayed, inputs, None, counts)
    assert torch.equal(replayed, counted)
    for i in range(state.shape[0]):
        n = int(counts[i])
        alone = state[i:i + 1].clone()
        y_alone = scan(alone, tuple(t[i:i + 1, :n] for t in inputs), tuple(t[i:i + 1, :n] for t in readout), None)
        assert torch.equal(counted[i:i + 1], alone)
        assert torch.equal(y_counted[i:i + 1, :n], y_alone)
        row = state[i:i + 1].clone()
        assert torch.equal(scan(row, tuple(t[i:i + 1] for t in inputs), tuple(t[i:i + 1] for t in readout), None),
                           y[i:i + 1])
        assert torch.equal(row, full_state[i:i + 1])
    return y, full_state


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@given(b=st.integers(1, 3), T=st.integers(0, 6), H=st.sampled_from([1, 2, 4, 6]), reps=st.sampled_from([1, 2, 3]),
       P=st.integers(1, 9), N=st.sampled_from([1, 7, 16, 17, 32, 40]), dt_max=st.sampled_from([0.0, 0.5, 4.0]),
       seed=st.integers(0, 2 ** 16), which=st.sampled_from(PATHS), data=st.data())
@example(b=2, T=5, H=4, reps=2, P=8, N=16, dt_max=0.5, seed=0, which="kernel", data=None)
def test_ssm_scan(b, T, H, reps, P, N, dt_max, seed, which, data):
    """Mamba-2's scan (heads sharing B / C by groups of ``reps``)."""
    if H % reps:
        reps = 1
    G = H // reps
    g = _gen(seed)
    x = torch.randn(b, T, H, P, generator=g)
    B, C = (torch.randn(b, T, G, N, generator=g) for _ in range(2))
    dt = torch.rand(b, T, H, generator=g) * dt_max
    decay = torch.exp(-dt * (1 + torch.rand(H, generator=g)))
    D, state = torch.randn(H, generator=g), torch.randn(b, H, P, N, generator=g)
    counts = _rows(b, T, data) if data is not None else torch.arange(b) % (T + 1)

    def scan(s, inputs, readout, n):
        x_, B_, dt_, decay_ = inputs
        if readout is None:  # (Mamba-2's scan always reads out: a replay is its readout dropped)
            ssm_scan(s, x_, B_, torch.zeros_like(B_), dt_, decay_, D, n)
            return None
        return ssm_scan(s, x_, B_, readout[0], dt_, decay_, D, n)

    with path("ssm_scan_", which):
        y, got = check_invariances(scan, state, (x, B, dt, decay), (C,), counts, T)
    s64, want, scale = state.double(), [], state.double().abs()
    Bh, Ch = (t.double().repeat_interleave(reps, dim=2) for t in (B, C))
    for t in range(T):
        s64 = s64 * decay[:, t, :, None, None].double() + (dt[:, t, :, None].double() * Bh[:, t])[:, :, None, :] \
            * x[:, t, ..., None].double()
        scale = scale + s64.abs()
        want.append((s64 * Ch[:, t, :, None, :]).sum(-1) + D[:, None].double() * x[:, t].double())
    close(got, s64, scale * 4)
    if T:
        out_scale = torch.stack([(scale * Ch[:, t, :, None, :].abs()).sum(-1) for t in range(T)], 1)
        close(y, torch.stack(want, 1), out_scale * 4 + x.double().abs())


@given(b=st.integers(1, 3), T=st.integers(0, 6), Hk=st.sampled_from([1, 2]), reps=st.sampled_from([1, 2, 3]),
       K=st.sampled_from([1, 5, 16, 33]), V=st.sampled_from([1, 7, 64, 65, 130]), gate=st.sampled_from([0.0, 1.0, 8.0]),
       channel=st.booleans(), seed=st.integers(0, 2 ** 16), which=st.sampled_from(PATHS), data=st.data())
@example(b=2, T=5, Hk=2, reps=2, K=8, V=6, gate=1.0, channel=False, seed=0, which="kernel", data=None)
@example(b=2, T=5, Hk=2, reps=1, K=8, V=70, gate=1.0, channel=True, seed=0, which="kernel", data=None)
def test_delta_scan(b, T, Hk, reps, K, V, gate, channel, seed, which, data):
    """The gated delta rule (each key head serving ``reps`` value heads; unit keys and queries as the layer hands
    them; decays from none to near total, one per head or, ``channel``, one per key channel: Kimi's KDA)."""
    Hv = Hk * reps
    g = _gen(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(b, T, Hk, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(b, T, Hv, V, generator=g)
    beta = torch.rand(b, T, Hv, generator=g)
    decay = torch.exp(-gate * torch.rand((b, T, Hv, K) if channel else (b, T, Hv), generator=g))
    state = torch.randn(b, Hv, K, V, generator=g)
    counts = _rows(b, T, data) if data is not None else torch.arange(b) % (T + 1)

    def scan(s, inputs, readout, n):
        return delta_scan(s, None if readout is None else readout[0], *inputs, n)

    with path("delta_scan_", which):
        y, got = check_invariances(scan, state, (k, v, beta, decay), (q,), counts, T)
    s64, want, scale = state.double(), [], state.double().abs()
    qh, kh = (t.double().repeat_interleave(reps, dim=2) for t in (q, k))
    for t in range(T):
        s64 = s64 * (decay[:, t, ..., None] if channel else decay[:, t, :, None, None]).double()
        delta = (v[:, t].double() - torch.einsum("bhkv,bhk->bhv", s64, kh[:, t])) * beta[:, t, :, None].double()
        s64 = s64 + kh[:, t, ..., None] * delta[:, :, None, :]
        # (the magnitudes each sum runs through: the state's, and the key's projection of it K-wide)
        scale = scale + s64.abs() + (s64.abs().sum(-2, keepdim=True) + v[:, t, :, None].double().abs())
        want.append(torch.einsum("bhkv,bhk->bhv", s64, qh[:, t]))
    close(got, s64, scale * 4)
    if T:
        out_scale = torch.stack([scale.sum(-2) for _ in range(T)], 1)
        close(y, torch.stack(want, 1), out_scale * 4)


@given(b=st.integers(1, 3), T=st.integers(0, 6), D=st.sampled_from([1, 8, 24, 32, 33, 70]),
       N=st.sampled_from([1, 4, 15, 16, 17, 32, 48]), dt_max=st.sampled_from([0.0, 0.5, 4.0]),
       seed=st.integers(0, 2 ** 16), which=st.sampled_from(PATHS), data=st.data())
@example(b=2, T=5, D=24, N=16, dt_max=0.5, seed=0, which="kernel", data=None)
def test_selective_scan(b, T, D, N, dt_max, seed, which, data):
    """Mamba(-1)'s selective scan (a decay per channel and state dim, exp(dt A))."""
    g = _gen(seed)
    x, B, C = (torch.randn(shape, generator=g) for shape in ((b, T, D), (b, T, N), (b, T, N)))
    dt = torch.rand(b, T, D, generator=g) * dt_max
    A = -torch.exp(torch.randn(D, N, generator=g))
    state = torch.randn(b, D, N, generator=g)
    counts = _rows(b, T, data) if data is not None else torch.arange(b) % (T + 1)

    def scan(s, inputs, readout, n):
        return selective_scan(s, inputs[0], inputs[1], A, inputs[2], None if readout is None else readout[0], n)

    with path("selective_scan_", which):
        y, got = check_invariances(scan, state, (x, dt, B), (C,), counts, T)
    s64, want, scale = state.double(), [], state.double().abs()
    for t in range(T):
        dtt = dt[:, t, :, None].double()
        s64 = s64 * torch.exp(dtt * A.double()) + (dtt * B[:, t, None, :].double()) * x[:, t, :, None].double()
        scale = scale + s64.abs() + (dtt * B[:, t, None, :].double() * x[:, t, :, None].double()).abs()
        want.append((s64 * C[:, t, None, :].double()).sum(-1))
    close(got, s64, scale * 4)
    if T:
        out_scale = torch.stack([(scale * C[:, t, None, :].double().abs()).sum(-1) for t in range(T)], 1)
        close(y, torch.stack(want, 1), out_scale * 4)
