import torch


def chunk_mean_keys(k: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Mean of each complete chunk of ``chunk_size`` positions: float32 ``[B, N // chunk_size, H, D]``."""
    B, N, H, D = k.shape
    C = N // chunk_size
    return k[:, : C * chunk_size].float().reshape(B, C, chunk_size, H, D).mean(dim=2)
