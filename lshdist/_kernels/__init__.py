"""numba kernels: pure functions over C-contiguous arrays (STYLE.md, "Kernels")."""
