"""tk.tree_attention_mask / tk.tree_depths against the parent-walking reference."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce_kernels.reference.tree_mask import tree_attention_mask as ref_mask
from triforce_kernels.reference.tree_mask import tree_depths as ref_depths


def random_parents(B, T, seed, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((B, T), -1, dtype=dtype)
    for t in range(1, T):
        parents[:, t] = (torch.rand(B, generator=g) * t).long().clamp_max(t - 1).to(dtype)
    return parents


@given(B=st.integers(1, 3), T=st.integers(1, 70), dtype=st.sampled_from([torch.int32, torch.int64]),
       seed=st.integers(0, 2**31 - 1))
@example(B=1, T=1, dtype=torch.int64, seed=0)  # root only
@example(B=2, T=64, dtype=torch.int32, seed=3)
def test_matches_reference(B, T, dtype, seed):
    parents = random_parents(B, T, seed, dtype)
    mask = tk.tree_attention_mask(parents)
    assert mask.dtype == torch.bool and mask.shape == (B, T, T)
    assert torch.equal(mask, ref_mask(parents))
    depths = tk.tree_depths(parents)
    assert depths.dtype == torch.int32 and torch.equal(depths, ref_depths(parents))


@pytest.mark.parametrize("T", [1, 2, 5, 33, 64])
def test_chain_is_causal_and_star_is_depth_one(T):
    chain = torch.arange(-1, T - 1).view(1, T)
    assert torch.equal(tk.tree_attention_mask(chain)[0], torch.ones(T, T, dtype=torch.bool).tril())
    assert torch.equal(tk.tree_depths(chain)[0], torch.arange(T, dtype=torch.int32))
    star = torch.zeros(1, T, dtype=torch.int64)
    star[0, 0] = -1
    m = tk.tree_attention_mask(star)[0]
    assert torch.equal(m, torch.eye(T, dtype=torch.bool) | (torch.arange(T) == 0)[None, :])
    assert tk.tree_depths(star)[0].tolist() == [0] + [1] * (T - 1)


def test_example_from_docstring():
    parents = torch.tensor([[-1, 0, 0, 1]])
    assert tk.tree_attention_mask(parents).int().tolist() == [[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]]
    assert tk.tree_depths(parents).tolist() == [[0, 1, 1, 2]]


@pytest.mark.parametrize("fn", [tk.tree_attention_mask, tk.tree_depths])
@pytest.mark.parametrize("parents, err, match", [
    (torch.tensor([[0, 0, 1]]), ValueError, "parents\\[b, 0\\] == -1"),          # no root
    (torch.tensor([[-1, 1, 0]]), ValueError, "parents\\[b, t\\] < t"),           # self loop
    (torch.tensor([[-1, 0, 3, 1]]), ValueError, "parents\\[b, t\\] < t"),        # forward edge
    (torch.tensor([[-1, 0], [-1, -1]]), ValueError, "0 <= parents"),            # second root
    (torch.tensor([-1, 0, 1]), ValueError, "parents must have 2 dimensions"),
    (torch.tensor([[-1.0, 0.0]]), TypeError, "parents must have dtype int32/int64"),
    (torch.zeros(1, 0, dtype=torch.int64), ValueError, "at least one node"),
    ([[-1, 0]], TypeError, "parents must be a torch.Tensor"),
])
def test_bad_parents(fn, parents, err, match):
    with pytest.raises(err, match=match):
        fn(parents)


def test_opcheck():
    """The custom op that carries the helpers' values check (so that torch.compile does not trace it):
    schema, fake implementation and dispatch (tests/test_compile.py compiles the helpers)."""
    from triforce_kernels.tree_mask import _tree_attention_mask_op

    for parents in (random_parents(2, 9, 0), random_parents(1, 1, 0, torch.int32)):
        torch.library.opcheck(_tree_attention_mask_op, (parents,))
