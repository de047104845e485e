"""Benchmarks, each a script (``python benchmarks/NAME.py``). A package only so the tests can
import the few modules they check (``benchmarks.hook_observers``, ``benchmarks.scheduler_replay``,
``benchmarks.vllm_engine``) by that name; benchmarks never import test helpers."""
