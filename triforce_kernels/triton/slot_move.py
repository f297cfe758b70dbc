"""Slot moves of a StreamingLLM cache's eviction on a GPU, without a host synchronisation.

An eviction fills the slots of evicted (or rolled-back) tokens with the kept tokens stored past the new
length (``triforce.models.cache.StreamingCache._settle``). How many slots each row moves is a device
value; reading it would be a host sync. So the caller passes a fixed width of candidate moves per row
(the most there can be) and the count that is real, and this kernel copies only the first ``count[b]``
of row ``b``: the other programs return at once. Moving the fixed width with a PyTorch gather and
scatter instead copies every padding slot onto itself: at SmolLM2-135M, batch 256 and a 256-token
window that is 2.2 GB read and written per draft step for the few slots that change.

Not a public op: the model layer's helper (``move_slots``), checked against the PyTorch move by
``tests/test_cache.py`` in the interpreter.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _move_slots_kernel(buf_ptr, dst_ptr, frm_ptr, count_ptr, P, R, stride_p, stride_b, stride_s, stride_m,
                       BLOCK: tl.constexpr):
    # one program per (candidate move j, row b); copies slot frm[b, j] onto slot dst[b, j] in each of
    # the P planes (k, v and un-rotated k of every layer): R contiguous elements per plane and slot
    j = tl.program_id(0)
    b = tl.program_id(1)
    if j < tl.load(count_ptr + b):
        d = tl.load(dst_ptr + b * stride_m + j).to(tl.int64)
        f = tl.load(frm_ptr + b * stride_m + j).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        row = buf_ptr + b.to(tl.int64) * stride_b
        for p in range(P):
            plane = row + p * stride_p
            for r0 in range(0, R, BLOCK):
                m = r0 + offs < R
                x = tl.load(plane + f * stride_s + r0 + offs, mask=m)
                tl.store(plane + d * stride_s + r0 + offs, x, mask=m)


def move_slots(buf: torch.Tensor, dst: torch.Tensor, frm: torch.Tensor, count: torch.Tensor) -> None:
    """``buf[p, b, dst[b, j]] = buf[p, b, frm[b, j]]`` for ``j < count[b]``, in place.

    ``buf`` ``[P, B, S, R]`` with its last dimension contiguous; ``dst``, ``frm`` int64 ``[B, W]`` with
    unit stride along ``W`` (the candidate moves; a row's first ``count[b]`` are real); ``count`` ``[B]``.
    The real moves' destinations must be distinct and none may be another move's source (an
    eviction's holes and kept tokens are disjoint), so the programs do not race."""
    P, B, S, R = buf.shape
    W = dst.shape[1]
    if W == 0 or B == 0 or P == 0 or R == 0:
        return
    assert buf.stride(3) == 1 and dst.stride(1) == 1 and frm.stride(1) == 1 and dst.stride(0) == frm.stride(0)
    count = count.to(torch.int64).contiguous()
    _move_slots_kernel[(W, B)](buf, dst, frm, count, P, R, buf.stride(0), buf.stride(1), buf.stride(2),
                               dst.stride(0), BLOCK=min(triton.next_power_of_2(R), 1024))
