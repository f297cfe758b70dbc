"""Triton kernels. Imported lazily (on the first call that selects the triton backend), so that
``import triforce_kernels`` never imports Triton, and TRITON_INTERPRET can still be set first."""
