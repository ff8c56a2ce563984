"""Runs that span nodes: what Ray places for this project beside what slime places (the eval
fleet: `eval_fleet.py`) and the run's other nodes reached through Ray (`nodes.py`: stop).

May import: krl_common.
"""
