"""``python -m triforce_kernels``: which backends run here, and why not."""
from triforce_kernels._backend import describe

if __name__ == "__main__":
    print(describe())
