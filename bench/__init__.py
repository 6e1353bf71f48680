"""Gleaner's benchmarks: its own overhead as ratios against ceilings measured in the same run."""
