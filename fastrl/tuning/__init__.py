"""Deciding how a run uses this machine: measuring its costs (profiling), choosing the
process layout from them (planner), moving threads while training (adapt), and
naming what holds a run back (bottleneck)."""
