"""ICML 2026 reproduction book: algorithm cores, results contract and batch runner."""
