"""Hypothesis profiles of the generated engine suite: ``ci`` (``make test``: a fixed,
derandomized set within its time budget), ``slow`` (``make test-slow``: more examples,
still a fixed set) and ``fuzz`` (``make fuzz-engine``: random seeds, round after round,
for as long as asked). Only ``fuzz`` steers its search with ``hypothesis.target`` (the
rows fed per row scored, :func:`.harness.check`): derandomized, 60 examples steered that way
stalled on near-duplicates of one case (30 of 60 ``seq`` cases one recipe) and missed
defects a plain draw of the same size finds, so ``ci`` and ``slow`` leave the target phase
out. Loadable before pytest configures (``-p
tests.differential.profiles --hypothesis-profile=fuzz``), which the suite then uses."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

CI_EXAMPLES = 12  # per family (five): 40 s of calls here (20: 90-180 s, the machine loaded)
SLOW_EXAMPLES = 60  # per family (100: 2m10 for the five here, loaded; in CI one family passed 600 s)
FUZZ_ROUND = 60  # examples per seed of make fuzz-engine

_COMMON = settings(deadline=None, database=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.large_base_example,
                                          HealthCheck.filter_too_much])
# (nor the explain phase: it traces every example while shrinking a failure, sys.settrace
# on Python 3.11, and a failing pair case still had not shrunk after Hypothesis's 5 minutes)
UNSTEERED = tuple(p for p in Phase if p not in (Phase.target, Phase.explain))
settings.register_profile("ci", _COMMON, max_examples=CI_EXAMPLES, derandomize=True,
                          phases=UNSTEERED)
settings.register_profile("slow", _COMMON, max_examples=SLOW_EXAMPLES, derandomize=True,
                          phases=UNSTEERED)
settings.register_profile("fuzz", _COMMON, max_examples=FUZZ_ROUND, derandomize=False)
OURS = ("ci", "slow", "fuzz")


def profile(default: str) -> settings:
    """The profile loaded on the command line if it is one of :data:`OURS`, else
    ``default``."""
    name = settings.get_current_profile_name()
    return settings.get_profile(name if name in OURS else default)
