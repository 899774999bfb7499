"""Experiments: the run entry point, configs, jobs and benchmarks."""
