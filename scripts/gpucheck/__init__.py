"""The steps of ``scripts/gpu_check.py``: build (here), run and diagnose (there, runtime only), report."""
