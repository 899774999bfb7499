"""The simulator side: what each simulator mode means (modes.py) and Verbalized Sampling."""
